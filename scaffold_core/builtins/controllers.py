"""Built-in controllers: native, majority_vote, best_of_n."""

from __future__ import annotations

import math
from collections import Counter
from typing import Annotated, Any

from annotated_types import Ge

from ..controller import Controller, close_controller, start_controller
from ..episode import EpisodeContext, Outcome
from ..generation import VerificationTask
from ..plugins.markers import hookimpl
from ..plugins.options import Help

#: Responses (or branches) per prompt: the one declaration of the option, its bound and its help.
Samples = Annotated[int, Ge(1), Help("responses per prompt, generated concurrently")]


class NativeController(Controller):
    """Generate ``samples`` responses to the prompt, concurrently; each is a training sample."""

    def __init__(self, samples: Samples = 1):
        self.samples = samples

    def process(self, ctx: EpisodeContext):
        tasks = [ctx.generation_task(i) for i in range(self.samples)]
        yield tasks
        return Outcome(samples=tasks, chosen=0 if len(tasks) == 1 else None)


def _sub_controller(spec: Any) -> Controller:
    if spec is None:
        return NativeController()
    from ..plugins.manager import current_path, current_registry

    return current_registry().build("controller", spec, path=f"{current_path('controller')}.generator",
                                    accepts=lambda obj: isinstance(obj, Controller))


class _SampleThenVerify(Controller):
    """Shared shape: run ``samples`` branches of a sub-controller, then verify every sample."""

    def __init__(self, samples: Annotated[int, Ge(1), Help("branches of the generator per prompt")] = 4,
                 generator: Annotated[Any, Help("the controller each branch runs (default: native)")] = None):
        self.samples = samples
        self.generator = _sub_controller(generator)

    async def start(self) -> None:
        await start_controller(self.generator)

    async def close(self) -> None:
        await close_controller(self.generator)

    def _sample_and_verify(self, ctx: EpisodeContext):
        # Each branch numbers its samples from its own base: a generator making k samples per branch
        # gets k numbers each, so no two samples share an index, a seed or a request id.
        width = max(1, int(getattr(self.generator, "samples", 1)))
        outcomes = yield self.parallel(self.generator, [ctx.branch(i * width) for i in range(self.samples)])
        samples = [s for outcome in outcomes for s in outcome.samples]
        checks = [VerificationTask(s.text, ctx.reference) for s in samples]
        yield checks
        for sample, check in zip(samples, checks):
            sample.verdict = check.verdict
        return samples


class MajorityVoteController(_SampleThenVerify):
    """Sample N answers, vote on the verifier's extracted answers; every sample is kept for training.

    Ties go to the answer seen first. Samples with no extractable answer do
    not vote. Reports ``maj@N``: whether the voted answer is correct.
    """

    def process(self, ctx: EpisodeContext):
        samples = yield from self._sample_and_verify(ctx)
        votes: Counter[str] = Counter()
        first: dict[str, int] = {}
        for i, sample in enumerate(samples):
            key = sample.verdict.vote_key
            if key is not None:
                votes[key] += 1
                first.setdefault(key, i)
        if votes:
            key = max(votes, key=lambda k: (votes[k], -first[k]))
            winner = samples[first[key]]
            answer, reward = winner.verdict.extracted, winner.verdict.reward
        else:
            answer, reward = None, 0.0
        return Outcome(samples=samples, answer=answer, answer_reward=reward,
                       metrics={f"maj@{self.samples}": float(reward > 0)})


class BestOfNController(_SampleThenVerify):
    """Sample N answers, score each with the verifier; the best (first on ties) is the episode's answer.

    Every sample is kept for training with its own reward.
    """

    def process(self, ctx: EpisodeContext):
        samples = yield from self._sample_and_verify(ctx)
        # an unscored sample (a verifier that could not score it: NaN reward) ranks below every scored one
        rewards = [None if math.isnan(s.verdict.reward) else s.verdict.reward for s in samples]
        best = max(range(len(samples)), key=lambda i: (rewards[i] is not None, rewards[i] or 0.0, -i))
        return Outcome(samples=samples, chosen=best, answer=samples[best].verdict.extracted,
                       answer_reward=samples[best].verdict.reward)


@hookimpl
def register_controllers(registry):
    registry.add("native", NativeController)
    registry.add("majority_vote", MajorityVoteController)
    registry.add("best_of_n", BestOfNController)
