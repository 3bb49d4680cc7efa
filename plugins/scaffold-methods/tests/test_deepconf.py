"""DeepConf on a scripted engine: confidences, the kept fraction, weighted votes, the online threshold and stop."""

from __future__ import annotations

import pytest
from methods_testkit import ScriptEngine, run
from scaffold_testkit import build

from scaffold_core.errors import ConfigError
from scaffold_core.sampling import SamplingParams
from scaffold_methods.deepconf import DeepConfController

ROWS = [{"id": "q", "question": "What is 7 + 5?", "answer": "12"}]
SAMPLING = SamplingParams(max_tokens=64, temperature=1.0, seed=3)
SURE = "Sure: 12. #### 12"  # every token confident: top-5 confidence 6.01
UNSURE_13 = "~~~~ 13 #### 13"  # its first window of 4 is all unsure: lowest group confidence 2.0


def offline(script, **options):
    engine = ScriptEngine(lambda q, i: script[i])
    options = {"samples": len(script), "window": 4, "top_logprobs": 5, **options}
    [result] = run(DeepConfController(**options), engine, ROWS, SAMPLING)
    assert result.ok, result.error
    return result, engine


def test_offline_keeps_the_confident_traces_and_votes_with_them():
    result, engine = offline([SURE, UNSURE_13, UNSURE_13, SURE], keep=0.5)
    confidences = [s.metadata["confidence"] for s in result.samples]
    assert confidences == pytest.approx([6.01, 2.0, 2.0, 6.01])
    assert [s.metadata.get("kept", False) for s in result.samples] == [True, False, False, True]
    assert result.answer == "12" and result.answer_reward == 1.0
    assert result.metrics["deepconf@4"] == 1.0 and result.metrics["voters"] == 2
    assert all(r.sampling.top_logprobs == 5 for r in engine.requests)
    # every trace is a training sample with its own reward
    assert [s.reward for s in result.samples] == [1.0, 0.0, 0.0, 1.0]
    assert result.metrics["policy_tokens"] == 2 * (len(SURE) + 1) + 2 * (len(UNSURE_13) + 1)


def test_offline_weights_votes_by_confidence():
    weighted, _ = offline([SURE, UNSURE_13, UNSURE_13], keep=1.0)
    assert weighted.answer == "12"  # 6.01 against 2.0 + 2.0
    unweighted, _ = offline([SURE, UNSURE_13, UNSURE_13], keep=1.0, weighted=False)
    assert unweighted.answer == "13" and unweighted.metrics["deepconf@3"] == 0.0
    sampled, _ = offline([SURE, UNSURE_13, UNSURE_13], keep=1.0, measure="sampled")
    assert sampled.answer == "12"
    assert sampled.samples[0].metadata["confidence_measure"] == "sampled"


def test_without_top_logprobs_auto_falls_back_and_top_k_fails_clearly():
    engine = ScriptEngine(lambda q, i: [SURE, UNSURE_13][i], top=False)
    [result] = run(DeepConfController(samples=2, window=4, keep=1.0), engine, ROWS, SAMPLING)
    assert result.ok and result.samples[0].metadata["confidence_measure"] == "sampled"
    engine = ScriptEngine(lambda q, i: [SURE, UNSURE_13][i], top=False)
    [result] = run(DeepConfController(samples=2, window=4, measure="top_k"), engine, ROWS, SAMPLING)
    assert result.status == "failed" and "measure: sampled" in result.error


def online(script, **options):
    engine = ScriptEngine(lambda q, i: script[i])
    options = {"samples": len(script), "mode": "online", "warmup": 2, "per_round": 2, "chunk": 4, "window": 4,
               "top_logprobs": 5, "keep": 0.9, "consensus": None, **options}
    [result] = run(DeepConfController(**options), engine, ROWS, SAMPLING)
    assert result.ok, result.error
    return result, engine


WARM_UNSURE = "ok ~~ 12 #### 12"  # lowest window: 2 unsure + 2 sure = 4.005
LATE_DROP = "abcdefgh~~~~ 99 #### 99"  # confident for 8 tokens, then unsure


def test_online_threshold_stops_a_trace_when_a_window_falls_below_it():
    result, engine = online([SURE, WARM_UNSURE, LATE_DROP, SURE])
    threshold = 4.005 + 0.1 * (6.01 - 4.005)  # the 10th percentile of the warm-up's lowest group confidences
    assert result.metrics["threshold"] == pytest.approx(threshold)
    stopped = [s for s in result.samples if s.finish_reason == "truncated"]
    assert len(stopped) == 1 and result.metrics["stopped_traces"] == 1 and result.metrics["traces"] == 4
    meta = stopped[0].metadata
    # windows ending at tokens 9 ("fgh~": 5.0075) and 10 ("gh~~": 4.005): the third chunk crossed the threshold
    assert meta["stopped_by"] == "deepconf" and meta["stopped_at"] == 12
    assert meta["group_confidence"] == pytest.approx(2.0) and meta["threshold"] == pytest.approx(threshold)
    assert stopped[0].output_ids == engine.tokenizer.encode(LATE_DROP[:12])
    # the stopped trace never voted; the warm-up trace below the threshold did not either
    assert result.metrics["voters"] == 2 and result.answer == "12"
    # the later traces were generated in chunks of 4
    late = [r for r in engine.requests if r.request_id.split("/")[2] in ("2", "3")]
    assert {r.sampling.max_tokens for r in late} == {4}
    assert result.metrics["policy_tokens"] == (len(SURE) + 1) * 2 + len(WARM_UNSURE) + 1 + 12


def test_online_can_drop_stopped_traces_from_the_samples():
    result, _ = online([SURE, WARM_UNSURE, LATE_DROP, SURE], keep_stopped=False)
    assert len(result.samples) == 3 and all(s.finish_reason == "stop" for s in result.samples)
    assert result.metrics["stopped_traces"] == 1
    assert result.metrics["policy_tokens"] == (len(SURE) + 1) * 2 + len(WARM_UNSURE) + 1 + 12


def test_online_consensus_starts_no_more_traces():
    result, engine = online([SURE] * 8, consensus=0.95)
    assert result.metrics["traces"] == 2 and len(engine.requests) == 2
    assert result.answer == "12" and len(result.samples) == 2
    result, engine = online([SURE, UNSURE_13] + [SURE] * 6, consensus=0.9, keep=1.0)
    # warm-up: 12 (6.01) against 13 (2.0) is 75%; after one round of two, 18.03 / 20.03 = 90%: no more rounds
    assert result.metrics["traces"] == 4 and result.answer == "12"
    assert sorted({r.request_id.split("/")[2] for r in engine.requests}) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("bad", [{"keep": 0.0}, {"keep": 1.5}, {"mode": "both"}, {"samples": 0},
                                 {"consensus": 0.0}, {"top_logprobs": 1}, {"trace_score": "median"}])
def test_bad_options_are_refused(bad):
    with pytest.raises((ConfigError, ValueError)):
        build(DeepConfController, **bad)
