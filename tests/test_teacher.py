"""The teacher of on-policy distillation: teacher-forced logprobs, the reverse-KL advantage, tokenizer checks."""

from __future__ import annotations

import asyncio

import pytest

from scaffold_core.errors import ConfigError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_core.teacher import DistillMix, Teacher, TeacherScores, check_same_tokenizer, reverse_kl_advantages
from scaffold_core.tokenizers import ByteTokenizer, render_chat

QUESTIONS = ["What is 2+3?", "Name a color.", "Count to five."]


def test_advantage_is_teacher_minus_student_mixed_with_the_reward():
    assert reverse_kl_advantages([-1.0, -2.0], [-1.5, -1.0]) == [0.5, -1.0]
    mixed = reverse_kl_advantages([-1.0, -2.0], [-1.5, -1.0], reward_advantage=2.0,
                                  mix=DistillMix(kl_weight=0.5, reward_weight=0.25, clip=0.6))
    assert mixed == pytest.approx([0.5 * 0.5 + 0.5, 0.5 * -0.6 + 0.5])
    with pytest.raises(ValueError, match="2 teacher logprobs for 1 student"):
        reverse_kl_advantages([-1.0, -2.0], [-1.0])


def test_teacher_calls_are_counted_apart():
    class Echo(Teacher):
        async def _score(self, batch):
            return [TeacherScores([-0.5] * len(c)) for _, c in batch]

    teacher = Echo()
    asyncio.run(teacher.score_batch([([1, 2, 3], [4, 5]), ([1], [6])]))
    assert teacher.stats.to_dict() | {"teacher_s": 0} == {"teacher_calls": 1, "teacher_samples": 2,
                                                          "teacher_tokens": 7, "teacher_scored_tokens": 3,
                                                          "teacher_s": 0}

    class Short(Teacher):
        async def _score(self, batch):
            return [TeacherScores([]) for _ in batch]

    with pytest.raises(RuntimeError, match="0 logprobs for 2 completion tokens"):
        asyncio.run(Short().score_batch([([1], [2, 3])]))


@pytest.mark.model
def test_a_teacher_scores_like_the_engine_and_a_same_model_teacher_gives_zero_advantage():
    torch = pytest.importorskip("torch")
    from scaffold_transformers.teacher import TransformersTeacher
    from scaffold_transformers.transformers_engine import TransformersEngine

    async def go():
        engine = TransformersEngine(max_batch_size=4, batch_wait_ms=20)
        teacher = TransformersTeacher(max_batch_size=2, top_k=3)  # the same (bundled) model, loaded again
        async with engine:
            await teacher.start()
            try:
                check_same_tokenizer(engine.tokenizer, teacher.tokenizer)
                prompts = [render_chat(engine.tokenizer, [{"role": "user", "content": q}])[1] for q in QUESTIONS]
                results = await asyncio.gather(*(engine.generate(GenerationRequest(
                    f"r{i}", p, SamplingParams(max_tokens=10, temperature=1.0), seed=7 + i))
                    for i, p in enumerate(prompts)))
                batch = [(p, r.output_ids) for p, r in zip(prompts, results)]
                scores = await teacher.score_batch(batch)
                return engine.model, batch, results, scores, teacher.stats
            finally:
                await teacher.close()

    model, batch, results, scores, stats = asyncio.run(go())
    assert stats.calls == 1 and stats.samples == 3 and stats.scored_tokens == sum(len(c) for _, c in batch)
    worst_forced = worst_advantage = 0.0
    for (prompt, completion), result, score in zip(batch, results, scores):
        with torch.inference_mode():  # one unpadded teacher-forced pass of the same model
            logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        forced = [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(completion)]
        worst_forced = max(worst_forced, max(abs(a - b) for a, b in zip(score.logprobs, forced)))
        advantage = reverse_kl_advantages(score.logprobs, result.logprobs)
        worst_advantage = max(worst_advantage, max(abs(a) for a in advantage))
        assert score.top_logprobs is not None and len(score.top_logprobs) == len(completion)
        assert all(len(top) == 3 and max(top.values()) >= lp - 1e-6 for top, lp in zip(score.top_logprobs,
                                                                                         score.logprobs))
    assert worst_forced <= 1e-3  # padded, batched scoring = the plain teacher-forced pass
    assert worst_advantage <= 1e-3  # teacher = student: zero advantage on every token


def test_a_teacher_with_another_tokenizer_is_refused():
    pytest.importorskip("transformers")
    from scaffold_core.engines.model_loading import resolve_model

    source = resolve_model(None)
    if source.gguf_file is None:
        pytest.skip("the bundled SmolLM2 GGUF is not installed")
    from transformers import AutoTokenizer

    smol = AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
    check_same_tokenizer(smol, smol)  # the same tokenizer passes
    with pytest.raises(ConfigError, match="tokenizer differs from the student's.*share one tokenizer"):
        check_same_tokenizer(smol, ByteTokenizer())
