"""On-policy distillation in AReaL's batch: ``teacher_logp`` in AReaL's name and alignment, joined by AReaL's own
``concat_padded_tensors`` (the fake, and the real one when AReaL is installed), and the workflow's teacher."""

from __future__ import annotations

import asyncio

import fake_areal
import pytest
from scaffold_areal.padding import episode_tensor_dict, to_padded_tensor_dict

from scaffold_core.teacher import Teacher, TeacherScores, score_samples
from scaffold_core.trajectory import TrainingSample

torch = pytest.importorskip("torch")


def sample(prompt, generated, *, mask=None, teacher=None, index=0):
    n = prompt + generated
    mask = mask or [0] * prompt + [1] * generated
    return TrainingSample(list(range(10, 10 + n)), mask, [0.0] * prompt + [-0.5] * generated,
                          [-1] * prompt + [0] * generated, 1.0, 0.0, "e", index, "g", prompt, "stop",
                          teacher_logprobs=teacher)


class Scripted(Teacher):
    """Scores token t of a completion -(t / 100): known values."""

    async def _score(self, batch):
        return [TeacherScores([-t / 100 for t in completion]) for _, completion in batch]


def scored(*samples):
    asyncio.run(score_samples(Scripted(), list(samples)))
    return samples


def concat_functions():
    yield "fake", fake_areal.concat_padded_tensors
    try:
        from areal.utils.data import concat_padded_tensors
    except ImportError:
        return
    yield "real", concat_padded_tensors


def test_teacher_logp_is_the_teacher_logprob_of_the_next_token_as_areal_aligns_it():
    (s,) = scored(sample(3, 4, mask=[0, 0, 0, 1, 1, 0, 1]))
    assert s.teacher_logprobs == [0.0, 0.0, 0.0, -0.13, -0.14, 0.0, -0.16]  # prompt and masked tokens: 0.0
    out = episode_tensor_dict(s)
    assert out["teacher_logp"].dtype == torch.float32 and out["teacher_logp"].shape == (1, 7)
    # entry i: the teacher's logprob of token i + 1 (AReaL's compute_logp alignment), 0.0 at the end
    assert out["teacher_logp"][0].tolist() == pytest.approx([0.0, 0.0, -0.13, -0.14, 0.0, -0.16, 0.0])
    # the reverse-KL reward AReaL's actor forms, teacher_logp - logprobs, lines up with the rolled behaviour logprobs
    rolled = torch.roll(out["logprobs"], shifts=-1, dims=-1) * torch.roll(out["loss_mask"], shifts=-1, dims=-1)
    reward = (out["teacher_logp"] - rolled)[0].tolist()
    assert reward[2:4] == pytest.approx([-0.13 + 0.5, -0.14 + 0.5]) and reward[5] == pytest.approx(-0.16 + 0.5)


@pytest.mark.parametrize("kind, concat", list(concat_functions()))
def test_padded_teacher_logp_equals_areals_join_of_the_episodes(kind, concat):
    samples = scored(sample(3, 4), sample(2, 7, index=1), sample(5, 1, index=2))
    joined = concat([episode_tensor_dict(s) for s in samples])
    padded = to_padded_tensor_dict(samples)
    assert set(joined) == set(padded) and "teacher_logp" in padded
    for key in padded:
        assert torch.equal(joined[key], padded[key]), key


def test_a_batch_with_teacher_logprobs_on_some_samples_only_is_refused():
    with pytest.raises(ValueError, match="1 of 2 samples carry teacher_logprobs"):
        to_padded_tensor_dict([scored(sample(3, 4))[0], sample(3, 4)])
    assert "teacher_logp" not in to_padded_tensor_dict([sample(3, 4)])
