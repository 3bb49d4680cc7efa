"""Each problem's answers, read from a run's episode records (heads: no token lists needed).

An episode is a problem. Its answers are the runs of the ``repeat`` controller
(``metadata.branch`` and ``metadata.branch_answer`` on the samples, see
:mod:`scaffold_core.builtins.repeat`), or, for a run made without it, its
samples, one answer each. An answer's tokens are every token its run
generated (all of a majority vote's samples, say).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Answer:
    """One answer: its vote key, reward (None: not scored), selection score, tokens spent, run number."""

    key: str | None
    reward: float | None
    tokens: int
    branch: int
    logprob: float | None = None
    sample: int | None = None
    response: str = ""
    score: float | None = None

    @property
    def correct(self) -> float:
        return 1.0 if self.reward is not None and self.reward > 0 else 0.0


@dataclass(slots=True)
class Problem:
    """One problem's scored answers (``unscored`` counts those left out: no reward)."""

    episode_id: str
    index: int
    reference: Any
    answers: list[Answer] = field(default_factory=list)
    unscored: int = 0

    @property
    def n(self) -> int:
        return len(self.answers)

    @property
    def correct(self) -> int:
        return sum(1 for a in self.answers if a.correct)


@dataclass(slots=True)
class Problems:
    """Every problem of a run: those with answers, and the count of failed episodes."""

    problems: list[Problem] = field(default_factory=list)
    failed: int = 0
    failed_ids: list[str] = field(default_factory=list)


def usable_number(reward: Any) -> float | None:
    """A number (a reward, a logprob) as a float, or None when it is not one (a boolean, NaN, missing)."""
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or math.isnan(reward):
        return None
    return float(reward)


def answers_of(head: dict[str, Any]) -> list[Answer]:
    """The answers of one completed episode record (scored or not), in run order."""
    samples = [s for s in head.get("samples") or [] if isinstance(s, dict)]
    branched = [s for s in samples if isinstance((s.get("metadata") or {}).get("branch"), int)]
    if not branched:
        return [Answer(key=_key(s), reward=usable_number(s.get("reward")), tokens=int(s.get("generated_tokens") or 0),
                       branch=i, sample=s.get("sample_index"), response=s.get("response") or "")
                for i, s in enumerate(samples)]
    runs: dict[int, list[dict[str, Any]]] = {}
    for s in branched:
        runs.setdefault(s["metadata"]["branch"], []).append(s)
    answers = []
    for branch in sorted(runs):
        run = runs[branch]
        found: dict[str, Any] = next((s["metadata"]["branch_answer"] for s in run
                                      if isinstance(s["metadata"].get("branch_answer"), dict)), {})
        chosen = next((s for s in run if s.get("sample_index") == found.get("sample")), None)
        answers.append(Answer(key=found.get("key"), reward=usable_number(found.get("reward")),
                              tokens=sum(int(s.get("generated_tokens") or 0) for s in run), branch=branch,
                              logprob=usable_number(found.get("logprob")), sample=found.get("sample"),
                              response=(chosen or {}).get("response") or ""))
    return answers


def _key(sample: dict[str, Any]) -> str | None:
    key = sample.get("key")
    return key if key is not None else sample.get("extracted")


def read_problems(heads: Iterable[dict[str, Any]]) -> Problems:
    """Every problem of the records ``heads`` (in the order given); failed episodes are counted, not used."""
    out = Problems()
    for head in heads:
        if head.get("status") != "ok":
            out.failed += 1
            out.failed_ids.append(str(head.get("episode_id")))
            continue
        problem = Problem(episode_id=str(head["episode_id"]), index=int(head.get("index") or 0),
                          reference=head.get("answer"))
        for answer in answers_of(head):
            if answer.reward is None:
                problem.unscored += 1
            else:
                problem.answers.append(answer)
        out.problems.append(problem)
    return out
