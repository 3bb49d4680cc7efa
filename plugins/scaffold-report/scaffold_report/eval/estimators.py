"""Estimators of what k answers to a problem achieve, from n >= k answers drawn for it.

Each is the exact expectation over the ``C(n, k)`` ways of choosing ``k`` of
the ``n`` answers (so nothing depends on the order the answers came in), and
so an unbiased estimate of the figure for ``k`` fresh answers:

* :func:`pass_at_k`: at least one of the k is correct, ``1 - C(n-c, k) / C(n, k)``
  (the estimator of Chen et al., 2021, "Evaluating Large Language Models Trained on Code");
* :func:`pass_hat_k` (pass^k): all k are correct, ``C(c, k) / C(n, k)`` (Yao et al., 2024, tau-bench);
* :func:`majority_at_k`: the answer most of the k agree on (by answer key) is correct;
* :func:`best_of_n_at_k`: the answer a score ranks first among the k is correct.

Ties, one rule for both votes and scores: every answer tied for first place is
equally likely to be picked, so a tie earns the fraction of the tied choices that
are correct (a 2-2 tie between a right and a wrong key earns 0.5). Answers
without a key cast no vote; k answers with no vote at all earn 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from math import comb

__all__ = ["pass_at_k", "pass_hat_k", "majority_at_k", "best_of_n_at_k", "vote_groups"]


def _check(n: int, k: int) -> None:
    if k < 1 or n < k:
        raise ValueError(f"need 1 <= k <= n answers, got k={k}, n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k answers drawn from these n (c of them correct) is correct."""
    _check(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: chance that all k answers drawn from these n (c of them correct) are correct."""
    _check(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    return comb(c, k) / comb(n, k)


def vote_groups(keys: Sequence[str | None], values: Sequence[float]) -> tuple[list[tuple[int, float]], int]:
    """``(size, value)`` per distinct key and the number of answers without a key, from each answer's key
    and value (1.0 correct, 0.0 wrong). A key's value is the mean of its answers' values (the same for
    every answer of a key when the verifier is consistent)."""
    sizes: Counter[str] = Counter()
    totals: dict[str, float] = {}
    no_key = 0
    for key, value in zip(keys, values):
        if key is None:
            no_key += 1
            continue
        sizes[key] += 1
        totals[key] = totals.get(key, 0.0) + float(value)
    return [(size, totals[key] / size) for key, size in sizes.items()], no_key


def majority_at_k(groups: Sequence[tuple[int, float]], no_key: int, k: int) -> float:
    """Expected value of the majority vote over k answers drawn from these (see the module's tie rule).

    ``groups``: ``(answers with this key, the key's value)`` per distinct key; ``no_key``: answers
    without a key. Exact, by the winning count ``m``: only keys with at least ``m`` answers can reach
    it, so the others join the answers without a key; over those that can, a dynamic programme counts
    the subsets by answers drawn and keys drawn exactly ``m`` times (the tie), none more than ``m``.
    """
    n = no_key + sum(size for size, _ in groups)
    _check(n, k)
    if k == 1:  # one answer: its key's value, or nothing
        return sum(size * value for size, value in groups) / n
    if k == n:  # every answer: one vote
        return _vote(groups)
    total = _wins_at_one(groups, n, k)
    for m in range(2, k + 1):
        able = [(size, value) for size, value in groups if size >= m]
        if not able:
            break
        free = n - sum(size for size, _ in able)
        total += _wins_at(able, free, m, k)
    return total / comb(n, k)


def _vote(groups: Sequence[tuple[int, float]]) -> float:
    """The value of the vote of all the answers (ties shared)."""
    if not groups:
        return 0.0
    top = max(size for size, _ in groups)
    tied = [value for size, value in groups if size == top]
    return sum(tied) / len(tied)


def _wins_at_one(groups: Sequence[tuple[int, float]], n: int, k: int) -> float:
    """:func:`_wins_at` for ``m = 1``: every key drawn is drawn once, so the keys drawn are the tie."""
    free = n - sum(size for size, _ in groups)
    ways = [1.0] + [0.0] * k  # ways[u]: subsets of u answers of distinct keys so far
    value = [0.0] * (k + 1)
    for size, worth in groups:
        for u in range(k - 1, -1, -1):  # downwards: each key adds at most one answer
            w = ways[u]
            if w:
                ways[u + 1] += w * size
                value[u + 1] += (value[u] + w * worth) * size
    return sum(value[u] / u * comb(free, k - u) for u in range(1, k + 1) if value[u] and k - u <= free)


def _wins_at(able: list[tuple[int, float]], free: int, m: int, k: int) -> float:
    """Sum over the k-subsets whose highest key count is exactly ``m`` of the vote's value (tie-shared)."""
    # ways[u][t]: subsets of the keys so far drawing u answers with t keys at exactly m, none above m;
    # value[u][t]: the same subsets' summed value of their keys at m.
    ways = [[0.0] * (len(able) + 1) for _ in range(k + 1)]
    value = [[0.0] * (len(able) + 1) for _ in range(k + 1)]
    ways[0][0] = 1.0
    for size, worth in able:
        counts = [float(comb(size, x)) for x in range(m + 1)]
        new_ways = [[0.0] * (len(able) + 1) for _ in range(k + 1)]
        new_value = [[0.0] * (len(able) + 1) for _ in range(k + 1)]
        for u in range(k + 1):
            row_w, row_v = ways[u], value[u]
            for t in range(min(u // m, len(able)) + 1):
                w = row_w[t]
                if not w:
                    continue
                v = row_v[t]
                for x in range(min(m, k - u) + 1):
                    c = counts[x]
                    if x == m:
                        new_ways[u + x][t + 1] += w * c
                        new_value[u + x][t + 1] += (v + w * worth) * c
                    else:
                        new_ways[u + x][t] += w * c
                        new_value[u + x][t] += v * c
        ways, value = new_ways, new_value
    total = 0.0
    for u in range(k + 1):
        rest = k - u
        if rest > free:
            continue
        fill = comb(free, rest)
        for t in range(1, len(able) + 1):
            if value[u][t]:
                total += value[u][t] / t * fill
    return total


def best_of_n_at_k(scores: Sequence[float | None], values: Sequence[float], k: int) -> float:
    """Expected value of the answer with the highest score among k drawn from these (ties: see the module).

    ``scores``: each answer's selection score (None ranks below every score); ``values``: 1.0 correct,
    0.0 wrong. An answer group of equal score ``s`` is first exactly when some of it is drawn and no
    answer scored above ``s`` is: ``C(n - above, k) - C(n - above - group, k)`` of the subsets.
    """
    n = len(values)
    _check(n, k)
    if len(scores) != n:
        raise ValueError(f"{len(scores)} scores for {n} answers")
    groups: dict[float | None, list[float]] = {}
    for score, value in zip(scores, values):
        groups.setdefault(score, []).append(float(value))
    order = sorted(groups, key=lambda s: (s is None, -(s or 0.0)))
    total = 0.0
    above = 0
    for score in order:
        members = groups[score]
        first = comb(n - above, k) - comb(n - above - len(members), k)
        total += first * sum(members) / len(members)
        above += len(members)
    return total / comb(n, k)
