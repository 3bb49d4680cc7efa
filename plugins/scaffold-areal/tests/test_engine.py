"""ArealEngine: scaffold's engine contract over agenerate (sampling mapping, stop reasons, errors)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from areal_helpers import EOS, TOKENIZER, backend, engine, logprobs_of
from scaffold_areal.engine import ALL_TOKENS, ArealEngine, gconfig_for, sampling_from_gconfig
from scaffold_testkit.replies import answers

from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams


@pytest.fixture(params=["fake", "real"])
def be(request):
    return backend(request.param)


def adapter(be, eng, **gconfig):
    g = be.classes.GenerationHyperparameters(**{"max_new_tokens": 32, "max_tokens": 4096, **gconfig})
    return ArealEngine(eng, request_cls=be.classes.ModelRequest, gconfig=g, tokenizer=TOKENIZER)


def generate(a, prompt, sampling, seed=None):
    return asyncio.run(a.generate(GenerationRequest("ep/0/0/1", list(prompt), sampling, seed=seed, episode_id="ep")))


def test_sampling_round_trips_through_gconfig(be):
    g = be.classes.GenerationHyperparameters(max_new_tokens=50, temperature=0.7, top_p=0.9, stop=["###"],
                                             stop_token_ids=[7])
    sp = sampling_from_gconfig(g)
    assert sp == SamplingParams(max_tokens=50, temperature=0.7, top_p=0.9, top_k=-1, stop=("###",),
                                stop_token_ids=(7,), seed=None)
    req = gconfig_for(g, sp.replace(max_tokens=12, temperature=0.0), seed=99)
    assert (req.n_samples, req.max_new_tokens, req.greedy, req.temperature) == (1, 12, True, 0.0)
    assert (req.top_k, req.stop, req.stop_token_ids) == (ALL_TOKENS, ["###"], [7])
    assert getattr(req, "seed", None) is None  # no seed unless the workflow's gconfig sets one
    assert g.max_new_tokens == 50 and not g.greedy  # the workflow's gconfig is never changed
    if "seed" not in {f.name for f in dataclasses.fields(g)}:
        return  # AReaL releases before the seed field
    seeded = be.classes.GenerationHyperparameters(seed=1)
    assert gconfig_for(seeded, sampling_from_gconfig(seeded), seed=99).seed == 99


def test_a_result_is_the_response_as_sampled(be):
    eng = engine(be, answers("#### 42 STOP trailing"))
    a = adapter(be, eng)
    result = generate(a, [5, 6, 7], SamplingParams(max_tokens=32, stop=("STOP",)))
    ids = TOKENIZER.encode("#### 42 STOP trailing") + [EOS]
    assert result.output_ids == ids and result.finish_reason == "stop"
    assert result.logprobs == logprobs_of(ids, 3, [0] * len(ids))
    assert result.text == "#### 42 "  # cut at the first stop string
    assert result.versions == [0] * len(ids) and result.weight_version == 0
    assert eng.requests[0].rid == "ep"


def test_length_and_tool_calls_map_to_scaffold_finish_reasons(be):
    eng = engine(be, answers("a long answer"))
    result = generate(adapter(be, eng), [5], SamplingParams(max_tokens=4))
    assert result.finish_reason == "length" and len(result.output_ids) == 4

    class ToolCalls:
        def get_version(self):
            return 0

        async def agenerate(self, req):
            return be.classes.ModelResponse(input_tokens=req.input_ids, output_tokens=[9], output_logprobs=[-0.5],
                                            output_versions=[0], stop_reason="tool_calls")

    assert generate(adapter(be, ToolCalls()), [5], SamplingParams(max_tokens=4)).finish_reason == "stop"


def test_a_response_with_mismatched_lengths_is_a_clear_engine_error(be):
    class Broken:
        def get_version(self):
            return 0

        async def agenerate(self, req):
            return be.classes.ModelResponse(input_tokens=req.input_ids, output_tokens=[9, 10],
                                            output_logprobs=[-0.5, -0.1], output_versions=[0], stop_reason="stop")

    with pytest.raises(EngineError, match="2 tokens, 2 logprobs and 1 versions") as info:
        generate(adapter(be, Broken()), [5], SamplingParams(max_tokens=4))
    assert not info.value.retryable


def test_a_prompt_with_no_room_left_is_not_sent(be):
    eng = engine(be, answers("x"))
    with pytest.raises(EngineError, match="no room under gconfig.max_tokens") as info:
        generate(adapter(be, eng, max_tokens=3), [5, 6, 7], SamplingParams(max_tokens=4))
    assert not info.value.retryable and not eng.requests
