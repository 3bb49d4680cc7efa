"""With the real SmolLM2 tokenizer and model: trajectories are the accumulated ids, the loss mask marks exactly the
assistant-generated tokens of the rendered conversation, logprobs line up, and the template never drifts."""

from __future__ import annotations

import math
import re

import pytest
from mt_helpers import TokenizerScriptedEngine, controller, registry, run
from scaffold_testkit import LiveEngine

from scaffold_core.chat_template import render_text
from scaffold_core.engine import Engine

ASSISTANT = "<|im_start|>assistant\n"
END = "<|im_end|>"


def gsm8k_setup(max_turns: int = 3, **task_options):
    reg = registry()
    task = reg.create("task", "multiturn_gsm8k", {"source": "sample", **task_options})
    options = {k: v for k, v in task.default_config["controller"].items() if k != "name"}
    options["max_turns"] = max_turns
    return reg, task, controller(reg, **options), reg.create("verifier", "gsm8k", {})


def generated_char_spans(text: str, turns: list[dict]) -> list[tuple[int, int]]:
    """Character spans of what the model generated in a rendered SmolLM2 conversation: each assistant turn's
    content, plus its <|im_end|> when the model sampled it (a turn cut by max_tokens was closed by us)."""
    spans = []
    starts = [m.end() for m in re.finditer(re.escape(ASSISTANT), text)]
    assert len(starts) == len(turns)
    for start, turn in zip(starts, turns):
        end = text.index(END, start)
        spans.append((start, end + (len(END) if turn["finish_reason"] == "stop" else 0)))
    return spans


def check_token_by_token(tok, result) -> None:
    """The trajectory against a fresh render of the conversation, token by token."""
    sample, traj = result.samples[0], result.trajectories[0]
    assert traj.input_ids == sample.prompt_ids + sample.output_ids
    messages = [*result.row["_messages"], *sample.metadata["messages"]]
    text = render_text(tok, messages, add_generation_prompt=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    n = len(traj.input_ids)
    assert enc["input_ids"][:n] == traj.input_ids  # the accumulated ids are the fresh render's ids
    assert tok.decode(enc["input_ids"][n:]) == ("\n" if sample.finish_reason == "stop" else END + "\n")
    spans = generated_char_spans(text, sample.metadata["turns"])
    for i, (start, end) in enumerate(enc["offset_mapping"][:n]):
        generated = any(s <= start and end <= e for s, e in spans)
        assert traj.loss_mask[i] == int(generated), (i, tok.convert_ids_to_tokens([traj.input_ids[i]]))
        if not generated:
            assert traj.logprobs[i] == 0.0 and traj.versions[i] == -1


class RememberMessages:
    """A task view that keeps each row's prompt messages in the row, to rebuild the conversation in checks."""

    def __init__(self, task):
        self.task = task

    def load(self):
        rows = []
        for row in self.task.load():
            rows.append({**row, "_messages": self.task.messages(row)})
        return rows

    def build_prompt(self, row, tokenizer):
        return self.task.build_prompt(row, tokenizer)

    def reference(self, row):
        return self.task.reference(row)


def test_bundled_sample_with_the_smollm2_tokenizer_token_by_token(smollm2_engine):
    """Every problem of the bundled sample, three turns each (a wrong answer, a turn cut by max_tokens, the
    worked solution), through SmolLM2's real tokenizer and chat template; no model decoding needed."""
    tok = smollm2_engine.tokenizer
    reg, task, ctrl, verifier = gsm8k_setup()
    rows = {r["question"]: r for r in task.load()}

    def respond(prompt, request):
        turn = prompt.count(ASSISTANT)
        row = rows[next(q for q in rows if q in prompt)]
        if turn == 1:
            return "Adding everything up, the answer is\n#### 1000001"
        if turn == 2:
            return "Let me redo this carefully, one step at a time, writing out every intermediate result. " * 12
        return row["answer"]

    engine = TokenizerScriptedEngine(tok, respond)
    results = run(RememberMessages(task), engine, ctrl, verifier=verifier, max_tokens=160)
    assert len(results) == 32
    for result in results:
        assert result.ok, result.error
        sample = result.samples[0]
        assert [t["finish_reason"] for t in sample.metadata["turns"]] == ["stop", "length", "stop"]
        assert result.metrics["drift"] == 0.0 and result.metrics["retokenize_mismatch"] == 0.0
        assert sample.reward == pytest.approx(0.25)  # right on the third turn: 0.5 ** 2
        assert sample.turn_rewards == [0.0, 0.0, 1.0]
        check_token_by_token(tok, result)
        traj = result.trajectories[0]
        for i, m in enumerate(traj.loss_mask):  # the scripted engine's logprobs are a function of the token id
            if m:
                assert traj.logprobs[i] == pytest.approx(-(1.0 + math.sin(traj.input_ids[i])) / 2.0 - 0.01)


class Recording(Engine):
    """Passes requests to an engine and keeps every (request, result)."""

    def __init__(self, inner):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.context_length = inner.context_length
        self.seen = []

    async def generate(self, request):
        result = await self.inner.generate(request)
        self.seen.append((request, result))
        return result


def test_real_model_conversations_are_token_faithful_and_drift_free(smollm2_engine):
    tok = smollm2_engine.tokenizer
    recording = Recording(smollm2_engine.engine)
    live = LiveEngine(recording, smollm2_engine.loop, timeout=600)
    reg, task, ctrl, verifier = gsm8k_setup(max_turns=2, limit=2)
    results = run(RememberMessages(task), live, ctrl, verifier=verifier, max_tokens=16, timeout=600)
    by_id = {r.request_id: (r, res) for r, res in recording.seen}
    for result in results:
        assert result.ok, result.error
        sample, traj = result.samples[0], result.trajectories[0]
        assert result.metrics["drift"] == 0.0, sample.metadata["drift"]
        check_token_by_token(tok, result)
        requests = sorted((r for r in by_id.values() if r[0].episode_id == result.episode_id),
                          key=lambda pair: pair[0].request_id)
        assert len(requests) == len(sample.metadata["turns"])
        for (request, res), turn in zip(requests, sample.metadata["turns"]):
            start, end = turn["start"], turn["end"]
            assert request.prompt_ids == traj.input_ids[:start]  # the model saw exactly the accumulated ids
            assert traj.input_ids[start:end] == res.output_ids  # and its sampled ids are kept as sampled
            assert traj.logprobs[start:end] == pytest.approx(res.logprobs)
            assert traj.loss_mask[start:end] == [1] * (end - start)
