"""ScaffoldAgentLoop.run against verl's server manager (fake, and real verl's classes when installed).

Every test checks the AgentLoopOutput exactly: prompt and response ids,
response mask, logprobs, reward, turns, metrics and version fields, against
what the server sampled, and that verl's padding accepts it.
"""

from __future__ import annotations

import asyncio

import fake_verl
import pytest
from scaffold_testkit.replies import answers, by_turn
from verl_helpers import (
    EOS,
    MESSAGES,
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    SAMPLING,
    TOKENIZER,
    backend,
    logprobs_of,
    padded,
    prompt_ids,
    run_loop,
    server,
)

from scaffold_core.controller import Controller
from scaffold_core.episode import Outcome, Sample
from scaffold_core.generation import VerificationTask


@pytest.fixture(params=["fake", "real"])
def be(request):
    return backend(request.param)


def check_output(be, out, prompt, response, mask, logprobs):
    assert isinstance(out, be.classes.AgentLoopOutput)
    assert out.prompt_ids == prompt
    assert out.response_ids == response
    assert out.response_mask == mask
    assert out.response_logprobs == logprobs
    tensors = padded(be, out)
    assert tuple(tensors["responses"].shape) == (1, RESPONSE_LENGTH)


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_native_single_turn_output_is_exact(be, flavour):
    srv = server(be, answers("#### 42"), backend=flavour)
    (out,) = run_loop(be, srv, {"verifier": "gsm8k"})
    prompt = prompt_ids()
    output = TOKENIZER.encode("#### 42") + [EOS]
    check_output(be, out, prompt, output, [1] * len(output), logprobs_of(output, len(prompt), [0] * len(output)))
    assert out.reward_score == 1.0 and out.num_turns == 2
    assert out.metrics.tool_calls == 0.0 and out.metrics.generate_sequences >= 0.0
    assert out.metrics.num_preempted == (0 if flavour == "vllm" else -1)
    extra = out.extra_fields
    assert (extra["global_steps"], extra["min_global_steps"], extra["max_global_steps"]) == (0, 0, 0)
    assert extra["turn_scores"] == [] and extra["tool_rewards"] == []
    assert extra["scaffold"]["finish_reason"] == "stop"
    (call,) = srv.calls
    sent = call["sampling_params"]
    assert sent == {**SAMPLING, "max_tokens": RESPONSE_LENGTH}  # explicit budget; verl's own keys kept
    assert call["prompt_ids"] == prompt and call["request_id"].endswith("/0")


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_the_token_limit_is_length_on_both_backends(be, flavour):
    srv = server(be, answers("The answer is #### 42"), backend=flavour)
    (out,) = run_loop(be, srv, {"verifier": "gsm8k"}, response_length=6)
    output = (TOKENIZER.encode("The answer is #### 42") + [EOS])[:6]
    assert out.response_ids == output and out.response_mask == [1] * 6
    assert out.extra_fields["scaffold"]["finish_reason"] == "length"
    assert srv.calls[0]["sampling_params"]["max_tokens"] == 6
    padded(be, out, response_length=6)


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_an_aborted_generation_is_continued_and_keeps_its_logprobs(be, flavour):
    """A weight sync aborts the call after 4 tokens; the rest is asked for with prompt + partial output."""
    srv = server(be, answers("The answer is #### 42"), backend=flavour, abort_after={0: 4}, step_after_abort=1)
    (out,) = run_loop(be, srv, {"verifier": "gsm8k", "resume_wait_s": 0.0})
    prompt = prompt_ids()
    output = TOKENIZER.encode("The answer is #### 42") + [EOS]
    first, second = srv.calls
    assert first["stop_reason"] in ("aborted", "abort") and first["output"] == output[:4]
    assert second["prompt_ids"] == prompt + output[:4]
    assert second["sampling_params"]["max_tokens"] == RESPONSE_LENGTH - 4
    steps = [0] * 4 + [1] * (len(output) - 4)
    check_output(be, out, prompt, output, [1] * len(output), logprobs_of(output, len(prompt), steps))
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (0, 1)
    assert out.reward_score == 1.0


def test_without_logprobs_the_output_has_none(be):
    srv = server(be, answers("#### 42"))
    (out,) = run_loop(be, srv, {"verifier": "gsm8k"}, sampling={**SAMPLING, "logprobs": False})
    assert out.response_logprobs is None and srv.calls[0]["sampling_params"]["logprobs"] is False
    assert "rollout_log_probs" not in padded(be, out)


def test_without_a_verifier_verl_scores_the_response(be):
    (out,) = run_loop(be, server(be, answers("#### 42")))
    assert out.reward_score is None


def test_majority_vote_hands_over_the_voted_sample(be):
    srv = server(be, answers("I think #### 41", "#### 42", "So: #### 42"))
    (out,) = run_loop(be, srv, {"controller": {"name": "majority_vote", "samples": 3}, "verifier": "gsm8k"})
    prompt = prompt_ids()
    by_sample = {int(c["request_id"].rsplit("/", 1)[1]): c["output"] for c in srv.calls}
    voted = [i for i in sorted(by_sample) if TOKENIZER.decode(by_sample[i], skip_special_tokens=True).endswith("42")]
    chosen = by_sample[voted[0]]  # the first sample carrying the voted answer
    check_output(be, out, prompt, chosen, [1] * len(chosen), logprobs_of(chosen, len(prompt), [0] * len(chosen)))
    assert out.reward_score == 1.0
    assert out.extra_fields["scaffold"]["samples"] == 3 and out.extra_fields["scaffold"]["metrics"] == {"maj@3": 1.0}
    assert len({c["request_id"] for c in srv.calls}) == 3  # one routing id per sample


def test_multiturn_chat_masks_the_environment_turn(be):
    pytest.importorskip("scaffold_multiturn")
    srv = server(be, by_turn("#### 41", "#### 42"))
    (out,) = run_loop(be, srv, {"controller": {"name": "multiturn_chat", "environment": "verifier_feedback"},
                                "verifier": "gsm8k", "trajectory": "multiturn"})
    prompt = prompt_ids()
    turn0, turn1 = srv.calls
    env = turn1["prompt_ids"][len(prompt) + len(turn0["output"]):]
    assert env and turn0["request_id"] == turn1["request_id"]  # one conversation, one server
    response = turn0["output"] + env + turn1["output"]
    mask = [1] * len(turn0["output"]) + [0] * len(env) + [1] * len(turn1["output"])
    start1 = len(prompt) + len(turn0["output"]) + len(env)
    logprobs = (logprobs_of(turn0["output"], len(prompt), [0] * len(turn0["output"])) + [0.0] * len(env)
                + logprobs_of(turn1["output"], start1, [0] * len(turn1["output"])))
    check_output(be, out, prompt, response, mask, logprobs)
    assert out.num_turns == 4 and out.reward_score == 1.0
    assert out.extra_fields["turn_scores"] == [0.0, 1.0]


def test_a_long_conversation_is_cut_to_response_length(be):
    pytest.importorskip("scaffold_multiturn")
    srv = server(be, by_turn("I am not sure, maybe #### 41", "#### 42"), response_length=40)
    (out,) = run_loop(be, srv, {"controller": {"name": "multiturn_chat", "environment": "verifier_feedback"},
                                "verifier": "gsm8k", "trajectory": "multiturn"}, response_length=40)
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) == 40
    assert srv.calls[1]["sampling_params"]["max_tokens"] == min(40, 256 + 40 - len(srv.calls[1]["prompt_ids"]))
    padded(be, out, response_length=40)


class DoubleCheck(Controller):
    """A third-party controller: answer, then the controller itself asks to double-check (mask 0), answer again."""

    CHECK = "\nDouble-check, then give the final answer.\n"

    def process(self, ctx):
        first = ctx.generation_task(0)
        yield [first]
        inserted = ctx.tokenizer.encode(self.CHECK)
        second = ctx.generation_task(0, prompt_ids=ctx.prompt_ids + first.output_ids + inserted)
        yield [second]
        check = VerificationTask(second.text, ctx.reference)
        yield [check]
        ids = first.output_ids + inserted + second.output_ids
        sample = Sample(prompt_ids=list(ctx.prompt_ids), output_ids=ids,
                        output_logprobs=first.logprobs + [0.0] * len(inserted) + second.logprobs,
                        output_mask=[1] * len(first.output_ids) + [0] * len(inserted) + [1] * len(second.output_ids),
                        text=second.text, finish_reason=second.finish_reason, verdict=check.need_verdict())
        return Outcome(samples=[sample], chosen=0)


def test_a_third_party_controller_keeps_its_inserted_tokens_masked(be):
    srv = server(be, answers("#### 41", "#### 42"))
    (out,) = run_loop(be, srv, {"controller": DoubleCheck(), "verifier": "gsm8k"})
    prompt = prompt_ids()
    first, second = srv.calls
    inserted = TOKENIZER.encode(DoubleCheck.CHECK)
    start = len(prompt) + len(first["output"]) + len(inserted)
    check_output(be, out, prompt, first["output"] + inserted + second["output"],
                 [1] * len(first["output"]) + [0] * len(inserted) + [1] * len(second["output"]),
                 logprobs_of(first["output"], len(prompt), [0] * len(first["output"])) + [0.0] * len(inserted)
                 + logprobs_of(second["output"], start, [0] * len(second["output"])))
    assert out.num_turns == 4 and out.reward_score == 1.0


def test_a_failed_episode_raises_with_its_reason(be):
    from scaffold_verl.loop import ScaffoldEpisodeError

    def broken(prompt_ids):
        raise ConnectionError("server gone")

    with pytest.raises(ScaffoldEpisodeError, match="server gone") as info:
        run_loop(be, server(be, broken), {"verifier": "gsm8k"})
    assert info.value.component == "engine"


def test_loops_of_one_worker_share_the_controller_and_verifier(be):
    from scaffold_verl import loop as loop_module

    started = []

    class Counting(Controller):
        async def start(self):
            started.append(1)

        def process(self, ctx):
            task = ctx.generation_task(0)
            yield [task]
            return Outcome(samples=[task], chosen=0)

    controller = Counting()
    outs = run_loop(be, server(be, answers("#### 42")), {"controller": controller, "verifier": "gsm8k"}, runs=3)
    assert [o.reward_score for o in outs] == [1.0, 1.0, 1.0]
    assert started == [1] and not loop_module._SHARED


def test_concurrent_samples_each_send_their_own_sampling_params(be):
    """verl awaits many runs at once, each with its own sampling_params: no request takes another's."""
    from scaffold_verl.loop import close_shared

    srv = server(be, answers("#### 42"))
    config = fake_verl.trainer_config(PROMPT_LENGTH, RESPONSE_LENGTH)
    entry = {"name": "scaffold_agent", "controller": {"name": "majority_vote", "samples": 2}, "verifier": "gsm8k"}
    params = {"a": {**SAMPLING, "temperature": 0.3},
              "b": {**SAMPLING, "temperature": 0.9, "top_p": 0.5, "logprobs": False}}

    async def main():
        try:
            loops = [fake_verl.instantiate(be.classes, entry, server=srv, tokenizer=TOKENIZER, config=config,
                                           target_cls=be.loop_cls) for _ in params]
            return await asyncio.gather(*(
                loop.run(dict(p), raw_prompt=list(MESSAGES), reward_model={"ground_truth": "42"}, uid=uid)
                for loop, (uid, p) in zip(loops, params.items())))
        finally:
            await close_shared()

    a, b = asyncio.run(main())
    assert len(srv.calls) == 4
    for call in srv.calls:
        uid = call["request_id"].split("-")[0]
        assert call["sampling_params"] == {**params[uid], "max_tokens": RESPONSE_LENGTH}
    assert a.response_logprobs is not None and b.response_logprobs is None
    assert a.reward_score == b.reward_score == 1.0


def test_a_row_without_raw_prompt_fails_clearly(be):
    from scaffold_verl.loop import ScaffoldEpisodeError

    with pytest.raises((ScaffoldEpisodeError, ValueError), match="raw_prompt"):
        run_loop(be, server(be, answers("#### 42")), {"verifier": "gsm8k"}, row={"prompt": MESSAGES})


def test_each_segment_gives_its_tokens_its_version_and_a_segment_resumed_by_the_server_the_oldest():
    """The engine adapter alone: an aborted segment on steps 3, then one the server itself resumed across a
    weight sync (min 4, max 5): the result's versions say so token by token, the oldest where it cannot tell."""
    from scaffold_verl.engine import VerlEngine

    from scaffold_core.generation import GenerationRequest
    from scaffold_core.sampling import SamplingParams

    token_output = fake_verl.fake_classes().TokenOutput
    segments = [token_output(token_ids=[40, 41], stop_reason="aborted", extra_fields={"global_steps": 3}),
                token_output(token_ids=[42, 43, EOS], stop_reason="completed",
                             extra_fields={"global_steps": 5, "min_global_steps": 4, "max_global_steps": 5})]

    class Servers:
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            return segments.pop(0)

    engine = VerlEngine(Servers(), tokenizer=TOKENIZER, prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH,
                        resume_wait_s=0.0)
    request = GenerationRequest("e/0/0/1", [1, 2, 3], SamplingParams(max_tokens=16), episode_id="e")
    result = asyncio.run(engine.generate(request)).check()
    assert result.output_ids == [40, 41, 42, 43, EOS] and result.finish_reason == "stop"
    assert result.versions == [3, 3, 4, 4, 4] and result.weight_version == 3
