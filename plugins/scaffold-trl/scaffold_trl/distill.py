"""On-policy distillation (``algorithm: opd``): per-token advantages from a teacher, in TRL's GRPO loss.

After TRL has padded a step's rollouts, the teacher scores every completion token under the
sample's exact prompt (:class:`~scaffold_core.teacher.Teacher`), and the advantage of token ``t``
becomes ``kl_weight * (teacher_logprob_t - student_logprob_t) + reward_weight * A`` where the
student's logprob is the behaviour logprob the engine sampled it with and ``A`` is TRL's group
advantage of the sample's reward (:class:`~scaffold_core.teacher.DistillMix`); tokens the model did
not generate (a multi-turn sample's environment tokens) get none. TRL's loss takes
advantages of shape (B, T) as they are (per token), so the clipped policy-gradient loss becomes
the per-token reverse-KL objective of on-policy distillation.

That signal only scores the token the student sampled. With ``opd_top_k_weight: w > 0`` and a teacher
that returns its top-k alternatives (``teacher: {top_k: K}``), the loss also gains ``w`` times a
distillation term over the teacher's top-k at every generated position (:func:`top_k_loss`): the
cross-entropy of the student against the teacher's top-k distribution (renormalised over those k
tokens), the forward KL up to the teacher's entropy. It needs the student's logits at those tokens, so
it takes one more forward pass of the batch.
"""

from __future__ import annotations

from typing import Any

from scaffold_core.errors import ConfigError
from scaffold_core.teacher import DistillMix, Teacher


def completion_rows(output: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    """Each row's (prompt ids, completion ids) without TRL's padding (prompts left-padded, completions right)."""
    rows = []
    for p, pm, c, cm in zip(output["prompt_ids"].tolist(), output["prompt_mask"].tolist(),
                            output["completion_ids"].tolist(), output["completion_mask"].tolist()):
        rows.append(([t for t, m in zip(p, pm) if m], [t for t, m in zip(c, cm) if m]))
    return rows


def distill_advantages(teacher: Teacher, loop: Any, output: dict[str, Any], mix: DistillMix,
                       timeout: float, top_k: int = 0) -> tuple[dict[str, float], list[list[float] | None]]:
    """Replace ``output["advantages"]`` (B,) with per-token advantages (B, T); return the step's figures
    (``teacher_kl``: mean over generated tokens of student - teacher logprob, the reverse-KL estimate;
    ``teacher_kl_max_sample``: the largest per-sample mean) and each row's teacher logprobs of its
    completion tokens (for the run's store; None for a row TRL masked whole).

    The teacher scores every completion token (environment tokens of a multi-turn sample included: they
    are part of what it conditions on); only tokens the model generated (TRL's ``tool_mask``, from
    scaffold's loss mask) get an advantage and count in the KL. ``top_k > 0``: the teacher's top-k go into
    ``output`` too (``teacher_top_k_ids``, ``teacher_top_k_logps``, see :func:`top_k_tensors`)."""
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
    if top_k:
        ids, logps = top_k_tensors(scores, student.shape[1], top_k)
        output["teacher_top_k_ids"], output["teacher_top_k_logps"] = ids.to(student.device), logps.to(student.device)
    # A row TRL masked whole (a truncated completion under mask_truncated_completions) was not scored: None.
    return figures, [list(s.logprobs) if s.logprobs else None for s in scores]


def top_k_tensors(scores: list[Any], length: int, k: int) -> tuple[Any, Any]:
    """The teacher's top-k of each row's completion positions as tensors (B, T, k): token ids, and their
    logprobs (-inf where the teacher gave fewer than k, or none for that position)."""
    import torch

    ids = torch.zeros((len(scores), length, k), dtype=torch.long)
    logps = torch.full((len(scores), length, k), float("-inf"))
    for i, s in enumerate(scores):
        if s.top_logprobs is None:
            raise ConfigError("opd_top_k_weight: the teacher returned no top-k alternatives; give it top_k "
                              "(teacher: {top_k: 8, ...}) or set opd_top_k_weight: 0")
        for t, alternatives in enumerate(s.top_logprobs[:length]):
            best = sorted(alternatives.items(), key=lambda kv: -kv[1])[:k]
            for j, (token, lp) in enumerate(best):
                ids[i, t, j], logps[i, t, j] = int(token), float(lp)
    return ids, logps


def top_k_loss(logits: Any, top_ids: Any, top_logps: Any, mask: Any) -> Any:
    """Mean over the masked positions of ``-sum_j q_j log p_student(token_j)``, where ``q`` is the teacher's
    top-k distribution renormalised over its k tokens: ``logits`` (B, T, V) the student's at the completion
    positions, ``top_ids``/``top_logps`` (B, T, k) from :func:`top_k_tensors`, ``mask`` (B, T)."""
    import torch

    # log p of the k tokens without a (B, T, V) log-softmax copy: gathered logits minus the log-partition
    student = logits.gather(-1, top_ids).float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True)
    known = torch.isfinite(top_logps)
    q = torch.softmax(top_logps.masked_fill(~known, -1e9), dim=-1) * known
    per_token = -(q * student.masked_fill(~known, 0.0)).sum(-1)
    has = known.any(-1).to(per_token.dtype) * mask.to(per_token.dtype)
    return (per_token * has).sum() / has.sum().clamp(min=1.0)
