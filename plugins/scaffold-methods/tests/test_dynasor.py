"""Dynasor on a scripted engine: the stop rule, hedged probes, probe masking and token counts."""

from __future__ import annotations

import pytest
from methods_testkit import ASSISTANT, ScriptEngine, run
from scaffold_testkit import build

from scaffold_core.errors import ConfigError
from scaffold_core.sampling import SamplingParams
from scaffold_core.trajectory import sample_tokens
from scaffold_methods.dynasor import DEFAULT_PROBE, DynasorController

ROWS = [{"id": "q", "question": "What is 7 + 5?", "answer": "12"}]
SAMPLING = SamplingParams(max_tokens=64, temperature=1.0, seed=3)
TRACE = "7 + 5: add ones. 7 + 5 = 12. Let me check it again, twice, to be sure."  # 72 characters


def engine_with(probes: dict[int, str], trace: str = TRACE) -> ScriptEngine:
    """The trace for the sample; a probe after ``n`` trace tokens answers ``probes[n]``."""

    def probe(prompt, request):
        partial = prompt.rpartition(ASSISTANT)[2]
        return probes[len(partial) - len(DEFAULT_PROBE)]

    return ScriptEngine(lambda q, i: trace, probe=probe, markers=[DEFAULT_PROBE])


def dynasor(engine, **options):
    [result] = run(DynasorController(**{"chunk": 8, "certainty": 2, **options}), engine, ROWS, SAMPLING)
    assert result.ok, result.error
    return result


def test_stops_when_consecutive_probes_agree_and_masks_the_probe():
    engine = engine_with({8: " 5\n", 16: " 12\n", 24: " 12\n"})
    result = dynasor(engine)
    [sample] = result.samples
    probe_ids = engine.tokenizer.encode(DEFAULT_PROBE)
    answer_ids = engine.tokenizer.encode(" 12\n")  # the reply stops at the end of its line
    assert sample.output_ids == engine.tokenizer.encode(TRACE[:24]) + probe_ids + answer_ids
    assert sample.output_mask == [1] * 24 + [0] * (len(probe_ids) + len(answer_ids))
    _, loss_mask, logprobs, _ = sample_tokens(sample)
    assert sum(loss_mask) == 24 and all(lp == 0.0 for lp, m in zip(logprobs, loss_mask) if not m)
    assert sample.text == TRACE[:24] + DEFAULT_PROBE + " 12\n" and sample.reward == 1.0
    assert sample.finish_reason == "stop" and sample.metadata["stopped_by"] == "dynasor"
    assert sample.metadata["trace_tokens"] == 24 and sample.metadata["probe_answers"] == ["5", "12", "12"]
    assert result.metrics["probes"] == 3 and result.metrics["stopped_early"] == 1.0
    assert sample.metadata["probe_replies"] == [" 5", " 12", " 12"]
    assert result.metrics["probe_tokens"] == 3 + 4 + 4
    assert result.metrics["policy_tokens"] == 24 + 11
    # probes are greedy and short; trace chunks keep the episode's sampling
    probes = [r for r in engine.requests if r.sampling.temperature == 0.0]
    assert len(probes) == 3 and {r.sampling.max_tokens for r in probes} == {16}
    assert {r.sampling.stop for r in probes} == {("\n",)}
    chunks = [r for r in engine.requests if r.sampling.temperature == 1.0]
    assert [r.sampling.max_tokens for r in chunks] == [8, 8, 8]


def test_hedged_probes_are_not_certain():
    engine = engine_with({8: " 12\n", 16: " 12, wait\n", 24: " 12\n", 32: " 12\n"})
    result = dynasor(engine)
    [sample] = result.samples
    assert sample.metadata["probe_answers"] == ["12", None, "12", "12"]
    assert sample.metadata["trace_tokens"] == 32 and result.metrics["probes"] == 4


def test_a_trace_that_ends_first_is_kept_whole():
    short = "7 + 5 = 12. #### 12"
    engine = engine_with({8: " 3\n", 16: " 4\n"}, trace=short)
    result = dynasor(engine)
    [sample] = result.samples
    assert sample.text == short and sample.output_mask == [1] * (len(short) + 1)
    assert "stopped_by" not in sample.metadata and result.metrics["stopped_early"] == 0.0
    assert result.metrics["policy_tokens"] == len(short) + 1 + 3 + 3


def test_max_tokens_ends_an_uncertain_trace_with_length():
    engine = engine_with({n: f" {n}\n" for n in range(8, 65, 8)})
    result = dynasor(engine)
    assert result.samples[0].finish_reason == "length" and len(result.samples[0].output_ids) == 64
    assert result.metrics["probes"] == 7  # no probe after the last chunk: the trace is over


def test_min_tokens_delays_the_first_probe():
    engine = engine_with({16: " 12\n", 24: " 12\n"})
    result = dynasor(engine, min_tokens=16)
    assert result.samples[0].metadata["probe_answers"] == ["12", "12"]


@pytest.mark.parametrize("bad", [{"chunk": 0}, {"certainty": 0}, {"probe": "  "}, {"probe_tokens": 0}])
def test_bad_options_are_refused(bad):
    with pytest.raises((ConfigError, ValueError)):
        build(DynasorController, **bad)
