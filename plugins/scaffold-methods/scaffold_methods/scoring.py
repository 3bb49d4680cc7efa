"""Scorers: what ranks responses (or partial solutions) inside an episode for ``rerank`` and ``tree_search``.

A scorer is any object with a generator method::

    def episode_scores(self, ctx, question, responses, partial=False):
        ...  # yield tasks (GenerationTask, AwaitTask) as a controller does
        return Scores(values, tokens, reasons)

``values[i]`` is a score in [0, 1], or ``None`` when response ``i`` could
not be scored (a malformed judgement): it is never read as 0.0, and an
unscored response ranks below every scored one. ``tokens`` counts what a
model verifier generated (the episode's ``verifier_tokens``).

A ``scorer:`` option names one:

* ``self_eval``: the policy judges itself, one token ("Yes"/"No") per
  response, its score P(yes) from the top logprobs (a ``judge`` on
  ``engine: policy`` in ``yes_no`` mode, with a prompt about partial steps
  when the tree search scores them);
* any registered verifier, with its options (``{name: judge, ...}``,
  ``{name: reward_model, checkpoint: ...}``): those with ``episode_scores``
  score in the episode; any other verifier is called with the episode's
  reference in a worker thread, one call per response, and its rewards used
  as scores.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from scaffold_core.episode import EpisodeContext
from scaffold_core.generation import AwaitTask
from scaffold_core.verifier import check_verdict

#: Sample indices of a scorer's own generation tasks (well above any response's), so their seeds and
#: request ids never collide with the responses'.
SCORER_INDEX = 1_000_000


@dataclass
class Scores:
    values: list[float | None]
    tokens: int = 0
    reasons: list[str] = field(default_factory=list)


def make_scorer(spec: Any, path: str) -> Any:
    """The scorer a ``scorer:`` option names (see the module docstring)."""
    if hasattr(spec, "episode_scores"):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"{path} must be a scorer name (self_eval, judge, reward_model, any verifier) or "
                         f"{{name: ..., options...}}, got {spec!r}")
    options = {k: v for k, v in spec.items() if k != "name"}
    name = spec["name"]
    if name == "self_eval":
        from .judge import JudgeVerifier

        return JudgeVerifier(**{"engine": "policy", "mode": "yes_no", "system": None, **options})
    from scaffold_core.plugins import current_registry

    verifier = current_registry().create("verifier", name, options, path=path)
    return verifier if hasattr(verifier, "episode_scores") else VerifierScorer(verifier)


class VerifierScorer:
    """Any verifier as a scorer: ``verify(response, ctx.reference)`` per response, in a worker thread."""

    def __init__(self, verifier: Any, timeout: float = 300.0):
        self.verifier = verifier
        self.timeout = timeout

    def episode_scores(self, ctx: EpisodeContext, question: str, responses: Sequence[str],
                       partial: bool = False) -> Generator[Any, Any, Scores]:
        verifier, reference = self.verifier, ctx.reference

        def verify_each() -> list[Any]:
            return [check_verdict(verifier, verifier.verify(r, reference), r, reference) for r in responses]

        wait = AwaitTask(lambda: asyncio.to_thread(verify_each), timeout=self.timeout, component="verifier",
                         what=f"verifier {type(verifier).__name__} as a scorer")
        yield [wait]
        values: list[float | None] = []
        for verdict in wait.result:
            reward = verdict.reward
            values.append(None if not verdict.scored or math.isnan(reward) else float(reward))
        return Scores(values, 0, [v.reason for v in wait.result])


class ScorerLifetime:
    """For a controller that owns a ``scorer``: starts and closes it with the controller (when it has
    ``start`` / ``close``)."""

    scorer: Any

    async def start(self) -> None:
        start = getattr(self.scorer, "start", None)
        if start is not None:
            await start()

    async def close(self) -> None:
        close = getattr(self.scorer, "close", None)
        if close is not None:
            await close()


def rank_key(score: float | None, order: int) -> tuple[int, float, int]:
    """Sort key, best first: scored before unscored, higher score first, earlier first on ties."""
    return (0 if score is not None else 1, -(score or 0.0), order)
