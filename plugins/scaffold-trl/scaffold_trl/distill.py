"""On-policy distillation (``algorithm: opd``): per-token advantages from a teacher, in TRL's GRPO loss.

After TRL has padded a step's rollouts, the teacher scores every completion token under the
sample's exact prompt (:class:`~scaffold_core.teacher.Teacher`), and the advantage of token ``t``
becomes ``kl_weight * (teacher_logprob_t - student_logprob_t) + reward_weight * A`` where the
student's logprob is the behaviour logprob the engine sampled it with and ``A`` is TRL's group
advantage of the sample's reward (:class:`~scaffold_core.teacher.DistillMix`); tokens the model did
not generate (a multi-turn sample's environment tokens) get none. TRL's loss takes
advantages of shape (B, T) as they are (per token), so the clipped policy-gradient loss becomes
the per-token reverse-KL objective of on-policy distillation.
"""

from __future__ import annotations

from typing import Any

from scaffold_core.teacher import DistillMix, Teacher


def completion_rows(output: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    """Each row's (prompt ids, completion ids) without TRL's padding (prompts left-padded, completions right)."""
    rows = []
    for p, pm, c, cm in zip(output["prompt_ids"].tolist(), output["prompt_mask"].tolist(),
                            output["completion_ids"].tolist(), output["completion_mask"].tolist()):
        rows.append(([t for t, m in zip(p, pm) if m], [t for t, m in zip(c, cm) if m]))
    return rows


def distill_advantages(teacher: Teacher, loop: Any, output: dict[str, Any], mix: DistillMix,
                       timeout: float) -> tuple[dict[str, float], list[list[float] | None]]:
    """Replace ``output["advantages"]`` (B,) with per-token advantages (B, T); return the step's figures
    (``teacher_kl``: mean over generated tokens of student - teacher logprob, the reverse-KL estimate;
    ``teacher_kl_max_sample``: the largest per-sample mean) and each row's teacher logprobs of its
    completion tokens (for the run's store; None for a row TRL masked whole).

    The teacher scores every completion token (environment tokens of a multi-turn sample included: they
    are part of what it conditions on); only tokens the model generated (TRL's ``tool_mask``, from
    scaffold's loss mask) get an advantage and count in the KL."""
    import torch

    student = output.get("sampling_per_token_logps")
    if student is None:
        raise RuntimeError("opd: the rollouts carry no behaviour logprobs to compare with the teacher's")
    rows = completion_rows(output)
    scores = loop.run(teacher.score_batch(rows), timeout)
    mask = output["completion_mask"].to(torch.float32)
    if output.get("tool_mask") is not None:
        mask = mask * output["tool_mask"].to(torch.float32)
    teacher_lp = torch.zeros_like(student)
    for i, s in enumerate(scores):
        teacher_lp[i, :len(s.logprobs)] = torch.tensor(s.logprobs, dtype=teacher_lp.dtype)
    diff = (teacher_lp - student) * mask
    if mix.clip is not None:
        diff = diff.clamp(-mix.clip, mix.clip)
    reward_adv = output["advantages"].to(diff.dtype)
    output["advantages"] = (mix.kl_weight * diff + mix.reward_weight * reward_adv[:, None]) * mask
    tokens = float(mask.sum().clamp(min=1.0))
    per_sample = (-diff).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    figures = {"teacher_kl": float((-diff).sum()) / tokens, "teacher_kl_max_sample": float(per_sample.max()),
               **teacher.stats.to_dict()}
    # A row TRL masked whole (a truncated completion under mask_truncated_completions) was not scored: None.
    return figures, [list(s.logprobs) if s.logprobs else None for s in scores]
