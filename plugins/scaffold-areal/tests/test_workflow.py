"""ScaffoldWorkflow.arun_episode against AReaL's agenerate (fake, and real AReaL's classes when installed).

Every test checks the tensor dict exactly: keys, dtypes, shapes, masks,
behaviour logprobs and per-token versions, against what the server sampled.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch
from areal_helpers import EOS, QUESTION, TOKENIZER, backend, engine, logprobs_of, prompt_ids, run, workflow
from fake_areal import concat_padded_tensors
from scaffold_testkit.replies import answers, by_turn

from scaffold_core.controller import Controller
from scaffold_core.episode import Outcome, Sample
from scaffold_core.generation import VerificationTask

RLVR_KEYS = ["input_ids", "loss_mask", "logprobs", "versions", "turn_ids", "attention_mask", "rewards"]
DTYPES = {"input_ids": torch.int32, "loss_mask": torch.int32, "logprobs": torch.float32, "versions": torch.int32,
          "turn_ids": torch.int32, "attention_mask": torch.bool, "rewards": torch.float32}


@pytest.fixture(params=["fake", "real"])
def be(request):
    return backend(request.param)


def keys_of(be) -> list[str]:
    """RLVR's keys; without turn_ids for AReaL releases before it."""
    return RLVR_KEYS if be.workflow_cls.areal.turn_ids else [k for k in RLVR_KEYS if k != "turn_ids"]


def check_contract(be, out: dict, rows: int, width: int) -> None:
    assert list(out) == keys_of(be)
    for key, dtype in DTYPES.items():
        if key not in out:
            continue
        assert out[key].dtype == dtype, key
        assert tuple(out[key].shape) == ((rows,) if key == "rewards" else (rows, width)), key


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_native_episode_is_the_rlvr_tensor_dict_with_real_logprobs(be):
    eng = engine(be, answers("#### 42"))
    wf = workflow(be)
    out = run(wf, eng)
    prompt = prompt_ids()
    output = TOKENIZER.encode("#### 42") + [EOS]
    n, m = len(prompt), len(output)
    check_contract(be, out, 1, n + m)
    assert out["input_ids"][0].tolist() == prompt + output
    assert out["loss_mask"][0].tolist() == [0] * n + [1] * m
    assert torch.equal(out["logprobs"][0], f32([0.0] * n + logprobs_of(output, n, [0] * m)))
    assert out["versions"][0].tolist() == [-1] * n + [0] * m
    if "turn_ids" in out:
        assert out["turn_ids"][0].tolist() == [-1] * n + [0] * m
    assert out["attention_mask"].all()
    assert out["rewards"].tolist() == [1.0]
    # what AReaL received: one request, n_samples 1, the workflow's budget, EOS and pad as stop ids, our tokenizer
    (req,) = eng.requests
    assert req.input_ids == prompt and req.gconfig.n_samples == 1 and req.gconfig.max_new_tokens == 64
    assert {TOKENIZER.eos_token_id, TOKENIZER.pad_token_id} <= set(req.gconfig.stop_token_ids)
    assert req.tokenizer is TOKENIZER and req.rid
    assert eng.request_copies[0].input_ids == req.input_ids  # agenerate copies; nothing changed the caller's request


def test_a_weight_update_mid_response_is_resumed_and_each_token_keeps_its_version(be):
    """AReaL aborts the in-flight request, resubmits prompt + partial output on the new weights: versions 0 then 1."""
    eng = engine(be, answers("The answer is #### 42"), updates={5: 1})
    out = run(workflow(be), eng)
    prompt = prompt_ids()
    output = TOKENIZER.encode("The answer is #### 42") + [EOS]
    n, m = len(prompt), len(output)
    first, second = eng.segments
    assert first.aborted and first.output == output[:5] and first.version == 0
    assert second.input_ids == prompt + output[:5] and second.version == 1
    assert second.sampling["max_new_tokens"] == 64 - 5
    versions = [0] * 5 + [1] * (m - 5)
    check_contract(be, out, 1, n + m)
    assert out["input_ids"][0].tolist() == prompt + output
    assert out["versions"][0].tolist() == [-1] * n + versions
    assert torch.equal(out["logprobs"][0], f32([0.0] * n + logprobs_of(output, n, versions)))
    assert out["loss_mask"][0].tolist() == [0] * n + [1] * m
    assert out["rewards"].tolist() == [1.0]


def test_majority_vote_returns_every_sample_padded_like_concat_padded_tensors(be):
    texts = ["#### 42", "I think it is #### 41", "#### 42"]
    eng = engine(be, answers(*texts))
    out = run(workflow(be, controller={"name": "majority_vote", "samples": 3}), eng)
    prompt = prompt_ids()
    n = len(prompt)
    outputs = [seg.output for seg in eng.segments]
    assert sorted(TOKENIZER.decode(o, skip_special_tokens=True) for o in outputs) == sorted(texts)
    width = n + max(len(o) for o in outputs)
    check_contract(be, out, 3, width)
    by_text = {tuple(o): o for o in outputs}
    for row in range(3):
        length = int(out["attention_mask"][row].sum())
        output = by_text[tuple(out["input_ids"][row, n:length].tolist())]
        m, pad = len(output), width - length
        assert length == n + m
        assert out["input_ids"][row].tolist() == prompt + output + [0] * pad
        assert out["loss_mask"][row].tolist() == [0] * n + [1] * m + [0] * pad
        assert out["versions"][row].tolist() == [-1] * n + [0] * m + [0] * pad
        if "turn_ids" in out:
            assert out["turn_ids"][row].tolist() == [-1] * n + [0] * m + [0] * pad
        assert out["attention_mask"][row].tolist() == [True] * length + [False] * pad
        assert torch.equal(out["logprobs"][row], f32([0.0] * n + logprobs_of(output, n, [0] * m) + [0.0] * pad))
        correct = "42" in TOKENIZER.decode(output, skip_special_tokens=True)
        assert out["rewards"][row].item() == (1.0 if correct else 0.0)


def test_majority_vote_with_samples_chosen_returns_the_voted_answer_only(be):
    eng = engine(be, answers("I think it is #### 41", "#### 42", "#### 42"))
    out = run(workflow(be, controller={"name": "majority_vote", "samples": 3}, samples="chosen"), eng)
    prompt = prompt_ids()
    output = TOKENIZER.encode("#### 42") + [EOS]
    check_contract(be, out, 1, len(prompt) + len(output))
    assert out["input_ids"][0].tolist() == prompt + output
    assert out["rewards"].tolist() == [1.0]


def test_multiturn_chat_masks_environment_turns_and_versions_follow_each_turn(be):
    """Turn 0 runs on weights 3, turn 1 on weights 4: AReaL's batch carries 3s and 4s, token by token."""
    pytest.importorskip("scaffold_multiturn")
    first = TOKENIZER.encode("#### 41") + [EOS]
    # the weight update lands exactly as turn 0 ends: turn 1 is generated on version 4
    eng = engine(be, by_turn("#### 41", "#### 42"), updates={len(first): 4})
    eng.set_version(3)
    wf = workflow(be, controller={"name": "multiturn_chat", "environment": "verifier_feedback", "max_turns": 3},
                  trajectory="multiturn")
    out = run(wf, eng)
    prompt = prompt_ids()
    turn0, turn1 = eng.segments
    second = TOKENIZER.encode("#### 42") + [EOS]
    assert turn0.output == first and turn1.output == second and (turn0.version, turn1.version) == (3, 4)
    env = turn1.input_ids[len(prompt) + len(first):]  # the feedback turn rendered by the template
    assert env and TOKENIZER.decode(env).count("<|user|>") == 1
    n, a, e, b = len(prompt), len(first), len(env), len(second)
    check_contract(be, out, 1, n + a + e + b)
    assert out["input_ids"][0].tolist() == turn1.input_ids + second
    assert out["loss_mask"][0].tolist() == [0] * n + [1] * a + [0] * e + [1] * b
    if "turn_ids" in out:
        assert out["turn_ids"][0].tolist() == [-1] * n + [0] * a + [-1] * e + [1] * b
    assert out["versions"][0].tolist() == [-1] * n + [3] * a + [-1] * e + [4] * b
    expected = [0.0] * n + logprobs_of(first, n, [3] * a) + [0.0] * e + logprobs_of(second, n + a + e, [4] * b)
    assert torch.equal(out["logprobs"][0], f32(expected))
    assert out["rewards"].tolist() == [1.0]


class ContinueAfterLength(Controller):
    """A third-party controller: a short first call, continued (prompt + partial) until the model stops; it keeps
    each call's versions as it keeps its logprobs."""

    def __init__(self, first_tokens: int = 4):
        self.first_tokens = first_tokens

    def process(self, ctx):
        task = ctx.generation_task(0, sampling=ctx.sampling.replace(max_tokens=self.first_tokens))
        yield [task]
        ids, logprobs, versions = list(task.output_ids), list(task.logprobs), list(task.versions or ())
        finish = task.finish_reason
        while finish == "length":
            more = ctx.generation_task(0, prompt_ids=ctx.prompt_ids + ids)
            yield [more]
            ids += more.output_ids
            logprobs += more.logprobs
            versions += more.versions or ()
            finish = more.finish_reason
        text = TOKENIZER.decode(ids, skip_special_tokens=True)
        check = VerificationTask(text, ctx.reference)
        yield [check]
        sample = Sample(prompt_ids=list(ctx.prompt_ids), output_ids=ids, output_logprobs=logprobs,
                        output_mask=[1] * len(ids), text=text, finish_reason=finish, verdict=check.need_verdict(),
                        weight_version=task.result.weight_version, versions=versions)
        return Outcome(samples=[sample], chosen=0)


def test_a_third_party_controller_gets_per_token_versions_across_its_calls(be):
    """Two engine calls make one run of generated tokens; a weight update between them shows in the versions."""
    eng = engine(be, answers("Let me see: #### 42"), updates={4: 3})
    out = run(workflow(be, controller=ContinueAfterLength(4)), eng)
    prompt = prompt_ids()
    output = TOKENIZER.encode("Let me see: #### 42") + [EOS]
    n, m = len(prompt), len(output)
    assert [s.version for s in eng.segments] == [0, 3] and len(eng.requests) == 2
    versions = [0] * 4 + [3] * (m - 4)
    check_contract(be, out, 1, n + m)
    assert out["input_ids"][0].tolist() == prompt + output
    assert out["versions"][0].tolist() == [-1] * n + versions
    assert torch.equal(out["logprobs"][0], f32([0.0] * n + logprobs_of(output, n, versions)))
    if "turn_ids" in out:
        assert out["turn_ids"][0].tolist() == [-1] * n + [0] * m
    assert out["rewards"].tolist() == [1.0]


def test_episodes_of_a_group_join_with_concat_padded_tensors(be):
    """AReaL runs arun_episode n times concurrently per prompt and joins them: same keys, right-padded."""
    eng = engine(be, answers("#### 42", "no idea", "#### 42 for sure"))
    wf = workflow(be)

    async def group():
        try:
            return await asyncio.gather(*(wf.arun_episode(eng, QUESTION) for _ in range(3)))
        finally:
            await wf.aclose()

    dicts = asyncio.run(group())
    batch = concat_padded_tensors(dicts)
    lengths = [d["input_ids"].shape[1] for d in dicts]
    assert tuple(batch["input_ids"].shape) == (3, max(lengths)) and tuple(batch["rewards"].shape) == (3,)
    assert sorted(batch["rewards"].tolist()) == [0.0, 1.0, 1.0]
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    assert len({req.rid for req in eng.requests}) == 3  # each episode its own rid


def test_a_failed_episode_is_rejected_with_its_reason_never_a_zero_reward(be, caplog):
    def broken(prompt_ids):
        raise ConnectionError("server gone")

    wf = workflow(be)
    with caplog.at_level(logging.WARNING, logger="scaffold_areal"):
        assert run(wf, engine(be, broken)) is None
    assert wf.stats["rejected_failed"] == 1
    assert "engine" in caplog.text and "server gone" in caplog.text


def test_truncated_samples_are_kept_unless_reject_truncated(be):
    gconfig = be.classes.GenerationHyperparameters(max_new_tokens=3, max_tokens=4096)
    kept = run(workflow(be, gconfig=gconfig), engine(be, answers("#### 42")))
    assert kept["loss_mask"][0].sum().item() == 3 and kept["rewards"].tolist() == [0.0]
    wf = workflow(be, gconfig=gconfig, reject_truncated=True)
    assert run(wf, engine(be, answers("#### 42"))) is None
    assert wf.stats["dropped_truncated"] == 1 and wf.stats["rejected_empty"] == 1


def test_samples_older_than_max_staleness_are_dropped(be):
    wf = workflow(be, max_staleness=2)
    assert run(wf, engine(be, answers("#### 42"), updates={2: 5})) is None  # oldest token v0, engine now at v5
    assert wf.stats["dropped_stale"] == 1
    out = run(workflow(be, max_staleness=5), engine(be, answers("#### 42"), updates={2: 5}))
    assert out["versions"][0].max().item() == 5


def test_on_stale_regenerate_runs_a_stale_episode_again_on_the_current_weights(be):
    eng = engine(be, answers("#### 42"), updates={2: 5})
    wf = workflow(be, max_staleness=2, on_stale="regenerate")
    out = run(wf, eng)
    prompt = prompt_ids()
    output = TOKENIZER.encode("#### 42") + [EOS]
    n, m = len(prompt), len(output)
    assert [s.version for s in eng.segments] == [0, 5, 5]  # interrupted at v0, resumed at v5; then the rerun
    check_contract(be, out, 1, n + m)
    assert out["input_ids"][0].tolist() == prompt + output
    assert out["versions"][0].tolist() == [-1] * n + [5] * m
    assert torch.equal(out["logprobs"][0], f32([0.0] * n + logprobs_of(output, n, [5] * m)))
    assert wf.stats["regenerated_stale"] == 1 and wf.stats["dropped_stale"] == 0
    assert len({req.rid for req in eng.requests}) == 2  # the rerun is an episode of its own


def test_turn_ids_can_be_chosen_for_the_areal_release(be):
    out = run(workflow(be, turn_ids=False), engine(be, answers("#### 42")))
    assert list(out) == [k for k in RLVR_KEYS if k != "turn_ids"]
    out = run(workflow(be, turn_ids=True), engine(be, answers("#### 42")))
    assert list(out) == RLVR_KEYS


def test_a_prompt_longer_than_max_tokens_fails_the_episode_clearly(be, caplog):
    gconfig = be.classes.GenerationHyperparameters(max_new_tokens=64, max_tokens=10)
    eng = engine(be, answers("#### 42"))
    with caplog.at_level(logging.WARNING, logger="scaffold_areal"):
        assert run(workflow(be, gconfig=gconfig), eng) is None
    assert "gconfig.max_tokens" in caplog.text and not eng.requests


@pytest.mark.parametrize("options, message", [
    (dict(verifier=None), "needs a verifier"),
    (dict(controller="majority_vot"), "majority_vote"),
    (dict(samples="best"), "samples must be one of"),
    (dict(max_staleness=-1), "max_staleness must be an integer >= 0"),
    (dict(on_stale="keep"), "on_stale must be one of drop, regenerate"),
])
def test_bad_options_fail_when_the_workflow_is_built(be, options, message):
    with pytest.raises(Exception, match=message):
        workflow(be, **options)
