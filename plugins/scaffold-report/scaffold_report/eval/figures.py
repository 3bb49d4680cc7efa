"""The figures of an evaluation: per k, each estimator's mean over problems with a bootstrap interval.

A figure at k is the mean over the problems with at least k scored answers of
that problem's estimate (:mod:`.estimators`). Its confidence interval is the
percentile bootstrap over problems: the problems are resampled with
replacement ``resamples`` times (seeded, so a figure is the same every time it
is computed) and the interval holds the middle ``confidence`` of the
resampled means. It measures how much the figure depends on which problems
were drawn, not the sampling noise of each problem's answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .answers import Problem, Problems
from .estimators import best_of_n_at_k, majority_at_k, pass_at_k, pass_hat_k, vote_groups

#: The figures per k, in the order they are shown.
METRICS = ("pass@k", "pass^k", "majority@k", "best_of_n@k")


def _majority(problem: Problem, k: int) -> float:
    groups, no_key = vote_groups([a.key for a in problem.answers], [a.correct for a in problem.answers])
    return majority_at_k(groups, no_key, k)


ESTIMATORS: dict[str, Callable[[Problem, int], float]] = {
    "pass@k": lambda p, k: pass_at_k(p.n, p.correct, k),
    "pass^k": lambda p, k: pass_hat_k(p.n, p.correct, k),
    "majority@k": _majority,
    "best_of_n@k": lambda p, k: best_of_n_at_k([a.score for a in p.answers], [a.correct for a in p.answers], k),
}


def parse_ks(text: str | Sequence[int]) -> list[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]`` (sorted, unique); ValueError naming the bad part otherwise."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    ks: set[int] = set()
    for part in parts:
        try:
            k = int(str(part).strip())
        except ValueError:
            raise ValueError(f"--k: {part!r} is not an integer; give a list such as 1,2,4,8,16") from None
        if k < 1:
            raise ValueError(f"--k: {k} is not >= 1; give a list such as 1,2,4,8,16")
        ks.add(k)
    if not ks:
        raise ValueError("--k: give at least one k, such as 1,2,4,8,16")
    return sorted(ks)


class Bootstrap:
    """Percentile intervals of means over problems, from one seeded set of resamples per problem count."""

    def __init__(self, resamples: int = 1000, confidence: float = 0.95, seed: int = 0):
        if resamples < 0:
            raise ValueError(f"resamples must be >= 0, got {resamples}")
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence}")
        self.resamples = resamples
        self.confidence = confidence
        self.seed = seed
        self._draws: dict[int, Any] = {}

    def interval(self, values: Sequence[float]) -> list[float] | None:
        """[low, high] of the mean of ``values``; None with no resamples or no values."""
        if not self.resamples or not values:
            return None
        import numpy as np

        count = len(values)
        draws = self._draws.get(count)
        if draws is None:
            draws = self._draws[count] = np.random.default_rng(self.seed).integers(0, count, (self.resamples, count))
        means = np.asarray(values, dtype=np.float64)[draws].mean(axis=1)
        tail = (1.0 - self.confidence) / 2.0
        low, high = np.quantile(means, [tail, 1.0 - tail])
        return [round(float(low), 6), round(float(high), 6)]


def figure(values: list[float], bootstrap: Bootstrap) -> dict[str, Any]:
    return {"value": round(sum(values) / len(values), 6) if values else None, "ci": bootstrap.interval(values)}


def eval_figures(problems: Problems, ks: Sequence[int], *, bootstrap: Bootstrap | None = None) -> dict[str, Any]:
    """Per k: every figure of :data:`METRICS` and the tokens spent per problem, with intervals; and totals."""
    bootstrap = bootstrap or Bootstrap()
    by_k = []
    for k in ks:
        usable = [p for p in problems.problems if p.n >= k]
        entry: dict[str, Any] = {"k": k, "problems": len(usable)}
        for name in METRICS:
            entry[name] = figure([ESTIMATORS[name](p, k) for p in usable], bootstrap)
        # k answers cost k times the problem's mean tokens per answer, in expectation
        entry["tokens_per_problem"] = figure([k * sum(a.tokens for a in p.answers) / p.n for p in usable], bootstrap)
        by_k.append(entry)
    answers = [a for p in problems.problems for a in p.answers]
    return {
        "problems": {"total": len(problems.problems) + problems.failed, "evaluated": len(problems.problems),
                     "failed": problems.failed, "without_answers": sum(1 for p in problems.problems if not p.n)},
        "answers": {"scored": len(answers), "unscored": sum(p.unscored for p in problems.problems),
                    "correct": sum(1 for a in answers if a.correct),
                    "mean_reward": round(sum(a.reward or 0.0 for a in answers) / len(answers), 6) if answers else None,
                    "mean_tokens": round(sum(a.tokens for a in answers) / len(answers), 3) if answers else None},
        "by_k": by_k,
    }
