"""Confidence of a reasoning trace from its token logprobs (DeepConf's measures), and weighted votes.

Token confidence, larger when the model is surer:

* ``top_k`` (DeepConf's definition): ``C_i = -mean(log p)`` over the ``k``
  most likely tokens at position ``i`` (from the engine's top logprobs). A
  peaked distribution puts the other ``k - 1`` tokens far below, so ``C_i``
  is large. Needs ``k`` of at least a few (with ``k = 1`` it would measure the
  opposite); DeepConf uses ``k = 20``.
* ``sampled`` (the fallback when the engine gives no top logprobs):
  ``C_i = p_i``, the probability of the sampled token, in ``(0, 1]``.

Group confidence: the mean token confidence over a sliding window of
``window`` tokens (every window of the trace; a trace shorter than one window
is one group, the mean of all its tokens). Trace confidence, one number per
trace:

* ``lowest_group``: the lowest group confidence (DeepConf's online measure);
* ``bottom_10``: the mean of the lowest 10% of group confidences;
* ``tail``: the mean token confidence of the last ``window`` tokens;
* ``mean``: the mean token confidence of the whole trace.

Every measure is positive, so it serves directly as a vote weight. Tokens
with a NaN logprob (a server that could not serialise one) are skipped.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Sequence
from typing import TypeVar

MEASURES = ("auto", "top_k", "sampled")
TRACE_SCORES = ("lowest_group", "bottom_10", "tail", "mean")
K = TypeVar("K", bound=Hashable)


def token_confidences(logprobs: Sequence[float], top: Sequence[dict[int, float]] | None,
                      measure: str) -> tuple[list[float], str]:
    """Per-token confidences of a trace and the measure used (``auto``: ``top_k`` when every position has them)."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    has_top = top is not None and len(top) == len(logprobs) and all(top)
    if measure == "top_k" and not has_top:
        raise ValueError("measure top_k needs the engine's top logprobs at every position, and this engine gave "
                         "none; use measure: sampled (or auto, which falls back to it)")
    if measure == "sampled" or not has_top:
        return [math.exp(lp) for lp in logprobs if not math.isnan(lp)], "sampled"
    assert top is not None
    out = []
    for position in top:
        values = [v for v in position.values() if not math.isnan(v) and v > -math.inf]
        if values:
            out.append(-sum(values) / len(values))
    return out, "top_k"


class GroupConfidence:
    """Sliding-window group confidences, fed token by token (as chunks of a trace arrive)."""

    def __init__(self, window: int):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._recent: deque[float] = deque()
        self._sum = 0.0
        self.count = 0
        self.total = 0.0
        self.groups: list[float] = []

    def add(self, values: Sequence[float]) -> list[float]:
        """Add token confidences; return the group confidences of the windows they complete."""
        new = []
        for value in values:
            self.count += 1
            self.total += value
            self._recent.append(value)
            self._sum += value
            if len(self._recent) > self.window:
                self._sum -= self._recent.popleft()
            if len(self._recent) == self.window:
                new.append(self._sum / self.window)
        self.groups.extend(new)
        return new

    def all_groups(self) -> list[float]:
        """Every window's confidence; a trace shorter than one window counts as one group."""
        if self.groups:
            return list(self.groups)
        return [self.total / self.count] if self.count else []

    def tail(self) -> float:
        return self._sum / len(self._recent) if self._recent else math.nan


def group_confidences(confidences: Sequence[float], window: int) -> list[float]:
    """The confidence of every window of ``window`` consecutive tokens (one group if the trace is shorter)."""
    groups = GroupConfidence(window)
    groups.add(confidences)
    return groups.all_groups()


def trace_confidence(confidences: Sequence[float], window: int, how: str = "lowest_group") -> float:
    """One trace's confidence by ``how`` (see the module docstring); NaN for a trace with no tokens."""
    if how not in TRACE_SCORES:
        raise ValueError(f"trace score must be one of {', '.join(TRACE_SCORES)}, got {how!r}")
    if not confidences:
        return math.nan
    if how == "mean":
        return sum(confidences) / len(confidences)
    if how == "tail":
        tail = confidences[-window:]
        return sum(tail) / len(tail)
    groups = group_confidences(confidences, window)
    if how == "lowest_group":
        return min(groups)
    lowest = sorted(groups)[: max(1, len(groups) // 10)]
    return sum(lowest) / len(lowest)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between order statistics (numpy's default)."""
    data = sorted(v for v in values if not math.isnan(v))
    if not data:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def weighted_vote(keys: Sequence[K | None], weights: Sequence[float]) -> tuple[K | None, float, float]:
    """(winning key, its weight, total weight) of a vote where item ``i`` gives ``weights[i]`` to ``keys[i]``.

    Items without a key or with a NaN weight do not vote; a tie goes to the
    key seen first.
    """
    totals: dict[K, float] = {}
    for key, weight in zip(keys, weights):
        if key is None or math.isnan(weight):
            continue
        totals[key] = totals.get(key, 0.0) + weight
    if not totals:
        return None, 0.0, 0.0
    best = max(totals, key=lambda k: totals[k])  # max keeps the first of equal totals (dict order: first seen)
    return best, totals[best], sum(totals.values())


def keep_top(scores: Sequence[float], fraction: float) -> list[int]:
    """Indices of the ``ceil(fraction * n)`` highest scores (at least one; ties to the earlier index), in order."""
    if not 0 < fraction <= 1:
        raise ValueError(f"keep must be within (0, 1], got {fraction}")
    ranked = sorted((i for i in range(len(scores)) if not math.isnan(scores[i])), key=lambda i: (-scores[i], i))
    if not ranked:
        return []
    count = max(1, math.ceil(fraction * len(scores) - 1e-9))
    return sorted(ranked[:count])
