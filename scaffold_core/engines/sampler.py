"""Choosing every row's next token, and its logprob, in one vectorised pass over the batch.

Each row applies its own temperature, top-k and top-p. A sampled row draws its
Gumbel noise from its own generator (seeded with the request's seed), so a
request samples the same tokens whether it runs alone or in a batch; the
arithmetic on the noise runs once for the whole batch (a loop of small per-row
operations costs more than the arithmetic on a busy CPU). Greedy rows
(temperature 0) take the argmax.

Logprobs follow the engine's ``logprobs`` option: ``temperature`` (default)
reports the temperature-scaled distribution before top-k/top-p truncation (the
same convention as SGLang); ``processed`` reports the distribution sampled,
after truncation and renormalisation. Greedy rows report the model's
untempered distribution.

``allowed`` (optional, [rows, vocab] booleans) restricts each row to the
tokens marked allowed before anything else is applied: the place where a
grammar's token mask (constrained decoding) enters sampling.
"""

from __future__ import annotations

from typing import Any

from ..sampling import SamplingParams


def sample(torch: Any, logits: Any, params: list[SamplingParams], generators: list[Any], *,
           processed: bool = False, allowed: Any = None) -> tuple[list[int], list[float], Any]:
    """(token per row, its logprob per row, the reported log-distribution [rows, vocab])."""
    logits = logits.float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    greedy = [g is None for g in generators]
    if all(greedy):
        choice = torch.argmax(logits, dim=-1)
        report = torch.log_softmax(logits, dim=-1)
        return choice.tolist(), report.gather(1, choice[:, None]).squeeze(1).tolist(), report
    temps = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], dtype=logits.dtype)
    scaled = logits / temps.to(logits.device)[:, None]
    filtered = truncate(torch, params, scaled)
    report = torch.log_softmax(filtered if processed else scaled, dim=-1)
    # Gumbel-max: each row's noise comes from its request's own generator; the arithmetic runs once for all rows
    vocab = logits.shape[-1]
    noise = torch.full((len(generators), vocab), 0.5, dtype=torch.float32)
    for i, g in enumerate(generators):
        if g is not None:
            torch.rand(vocab, generator=g, out=noise[i])
    gumbel = noise.clamp_(min=1e-20).log_().neg_().log_().to(device=logits.device, dtype=filtered.dtype)
    choice = torch.argmax(filtered - gumbel, dim=-1)
    if any(greedy):  # greedy rows take the argmax and report the untempered distribution
        is_greedy = torch.tensor(greedy, device=logits.device)
        choice = torch.where(is_greedy, torch.argmax(logits, dim=-1), choice)
        report = torch.where(is_greedy[:, None], torch.log_softmax(logits, dim=-1), report)
    return choice.tolist(), report.gather(1, choice[:, None]).squeeze(1).tolist(), report


def truncate(torch: Any, params: list[SamplingParams], scaled: Any) -> Any:
    """Apply each row's top-k and top-p to temperature-scaled logits (-inf outside)."""
    ks = [p.top_k for p in params]
    ps = [p.top_p for p in params]
    out = scaled
    vocab = scaled.shape[-1]
    if any(0 < k < vocab for k in ks):
        kmax = max(k if 0 < k < vocab else 1 for k in ks)
        top = torch.topk(scaled, kmax, dim=-1).values
        idx = torch.tensor([min(k, kmax) - 1 if 0 < k < vocab else 0 for k in ks], device=scaled.device)
        threshold = top.gather(1, idx[:, None])
        apply = torch.tensor([0 < k < vocab for k in ks], device=scaled.device)[:, None]
        out = torch.where(apply & (scaled < threshold), torch.full_like(scaled, float("-inf")), out)
    if any(p < 1.0 for p in ps):
        sorted_logits, order = torch.sort(out, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(-1) - probs  # mass strictly above each token
        top_p = torch.tensor(ps, dtype=scaled.dtype, device=scaled.device)[:, None]
        drop_sorted = before >= top_p  # keeps the smallest prefix reaching top_p (first always kept)
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def top_logprobs(torch: Any, report: Any, ks: list[int]) -> list[dict[int, float] | None]:
    """Per row, its ``k`` most likely tokens and their logprobs (``None`` where ``k`` is 0); one topk for all."""
    kmax = min(max(ks, default=0), report.shape[-1])
    if kmax <= 0:
        return [None] * len(ks)
    values, ids = torch.topk(report, kmax, dim=-1)
    values, ids = values.tolist(), ids.tolist()
    return [dict(zip(ids[i][:k], values[i][:k])) if k > 0 else None for i, k in enumerate(ks)]
