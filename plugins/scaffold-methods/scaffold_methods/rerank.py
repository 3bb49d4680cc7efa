"""The ``rerank`` controller: best-of-N where a scorer (a judge, a reward model, self-evaluation) picks the answer.

``samples`` responses are generated at once; the ``scorer`` scores each (see
``scoring.py``); the highest score is the episode's answer (``chosen``), the
first on ties, unscored responses last. The run's verifier still gives every
sample its own reward, so training data and accuracy come from the task's
reference while the choice comes from the scorer: the built-in
``best_of_n`` chooses by the run's verifier instead.

Each sample's ``metadata`` holds its ``score`` (``None``: unscored) and the
scorer's reason. Metrics: ``best@N`` (the chosen response is correct),
``unscored`` (responses the scorer could not score), ``policy_tokens``,
``verifier_tokens``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Annotated, Any, ClassVar

from annotated_types import Ge

from scaffold_core.controller import Controller
from scaffold_core.episode import EpisodeContext, Outcome, Sample
from scaffold_core.plugins import Help

from .accounting import TokenCount, question_of, verify_texts
from .scoring import ScorerLifetime, make_scorer, rank_key


class RerankController(ScorerLifetime, Controller):
    """Best-of-N by a scorer (see the module docstring)."""

    shared: ClassVar[tuple[str, ...]] = ("scorer",)  # keeps no per-episode state; may hold an engine or a model

    def __init__(self, samples: Annotated[int, Ge(1), Help("candidates per prompt")] = 8, scorer: Any = "self_eval"):
        self.samples = samples
        self.scorer = make_scorer(scorer, "controller.scorer")

    def process(self, ctx: EpisodeContext) -> Generator[Any, Any, Outcome]:
        count = TokenCount()
        tasks = [ctx.generation_task(i) for i in range(self.samples)]
        yield tasks
        count.policy_tasks(tasks)
        samples = [Sample.from_task(t) for t in tasks]
        scores = yield from self.scorer.episode_scores(ctx, question_of(ctx), [s.text for s in samples])
        count.verifier += scores.tokens
        verdicts = yield from verify_texts(ctx, [s.text for s in samples])
        for sample, verdict, score, reason in zip(samples, verdicts, scores.values, scores.reasons):
            sample.verdict = verdict
            sample.metadata.update(score=score, score_reason=reason)
        best = min(range(len(samples)), key=lambda i: rank_key(scores.values[i], i))
        chosen = samples[best].verdict
        assert chosen is not None
        metrics = {f"best@{self.samples}": float(chosen.correct),
                   "unscored": float(sum(v is None for v in scores.values)), **count.metrics()}
        return Outcome(samples=samples, chosen=best, answer=chosen.extracted, metrics=metrics)
