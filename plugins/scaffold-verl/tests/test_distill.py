"""On-policy distillation in verl's format: ``extra_fields["teacher_ids"/"teacher_logprobs"]`` as verl's own
teacher builds them, padded by verl's ``_pad_teacher_outputs`` (the real one when verl is installed)."""

from __future__ import annotations

import pytest
from scaffold_testkit.replies import answers
from verl_helpers import EOS, PROMPT_LENGTH, RESPONSE_LENGTH, TOKENIZER, backend, prompt_ids, run_loop, server

from scaffold_core.teacher import Teacher, TeacherScores

torch = pytest.importorskip("torch")


class Scripted(Teacher):
    """Scores completion token t as -(t / 1000): known values."""

    async def _score(self, batch):
        return [TeacherScores([-t / 1000 for t in completion]) for _, completion in batch]


def pad_functions():
    import torch.nn.functional as F

    def fake(ids, logprobs, prompt_width, response_width, prompt_length, response_length, pad_token_id):
        padding = (0, 0, prompt_width - prompt_length, response_width - response_length)
        return F.pad(ids, padding, value=pad_token_id).unsqueeze(0), F.pad(logprobs, padding, value=0.0).unsqueeze(0)

    yield "fake", fake
    try:
        from verl.experimental.teacher_loop.teacher_manager import _pad_teacher_outputs
    except ImportError:
        return
    yield "real", _pad_teacher_outputs


@pytest.mark.parametrize("kind, pad", list(pad_functions()))
def test_the_agent_loop_hands_the_teachers_logprobs_in_verls_format(kind, pad):
    be = backend("fake")
    srv = server(be, answers("#### 42"), backend="vllm")
    (out,) = run_loop(be, srv, {"verifier": "gsm8k", "teacher": Scripted()})
    prompt = prompt_ids()
    response = TOKENIZER.encode("#### 42") + [EOS]
    sequence = prompt + response
    ids, logprobs = out.extra_fields["teacher_ids"], out.extra_fields["teacher_logprobs"]
    # verl's vLLM teacher: S x 1, entry i the next token i + 1 and its logprob, then a dummy (0, 0.0)
    assert ids.dtype == torch.int32 and tuple(ids.shape) == (len(sequence), 1)
    assert logprobs.dtype == torch.float32 and tuple(logprobs.shape) == (len(sequence), 1)
    assert ids[:, 0].tolist() == sequence[1:] + [0]
    expected = [0.0] * (len(prompt) - 1) + [-t / 1000 for t in response] + [0.0]
    assert logprobs[:, 0].tolist() == pytest.approx(expected)
    padded_ids, padded_logprobs = pad(ids, logprobs, prompt_width=PROMPT_LENGTH, response_width=RESPONSE_LENGTH,
                                      prompt_length=len(prompt), response_length=len(response), pad_token_id=0)
    assert tuple(padded_ids.shape) == (1, PROMPT_LENGTH + RESPONSE_LENGTH, 1)
    left = PROMPT_LENGTH - len(prompt)
    assert padded_logprobs[0, left:left + len(sequence), 0].tolist() == pytest.approx(expected)


def test_without_a_teacher_there_are_no_teacher_fields():
    be = backend("fake")
    (out,) = run_loop(be, server(be, answers("#### 42"), backend="vllm"), {"verifier": "gsm8k"})
    assert "teacher_ids" not in out.extra_fields and "teacher_logprobs" not in out.extra_fields
