"""The built-in ``repeat`` controller: any controller run ``n`` times on one problem, each run's answer recorded.

``scaffold eval`` wraps the configured controller in it to get ``max(k)``
independent answers per problem, whatever the controller is (one sample, a
majority vote, an agent). Each run is a parallel branch on its own clone and
context, so the runs share nothing but the prompt. Every sample of branch
``i`` carries ``metadata["branch"] = i``; the first sample of each branch
also carries ``metadata["branch_answer"]``, the run's answer:

* ``sample``: the sample index of the answer (None when the answer is no one sample's);
* ``extracted``, ``key``, ``reward``: the verifier's reading of it (``key``
  is what votes count: answers with equal keys are the same answer);
* ``logprob``: the mean behaviour logprob of the answer's generated tokens (None when unknown).

A run's answer is the sample the controller chose (``Outcome.chosen``:
best_of_n), else the answer it named (``Outcome.answer``/``answer_reward``:
majority_vote), else its only sample. A controller that returns several
samples and names no answer has no single answer: its episode fails, and
``native`` with ``samples`` above 1 is refused when the config is checked.
"""

from __future__ import annotations

from typing import Annotated, Any

from annotated_types import Ge

from ..controller import Controller, close_controller, start_controller
from ..episode import EpisodeContext, Outcome, Sample
from ..errors import ControllerError
from ..generation import VerificationTask
from ..plugins.markers import hookimpl
from ..plugins.options import Help
from .controllers import NativeController, _sub_controller


def sample_width(controller: Any) -> int:
    """How many sample numbers one run of ``controller`` may use: its ``samples`` times its sub-controller's."""
    samples = getattr(controller, "samples", 1)
    width = samples if isinstance(samples, int) and not isinstance(samples, bool) and samples > 0 else 1
    for attr in ("generator", "controller"):
        sub = getattr(controller, attr, None)
        if isinstance(sub, Controller):
            width *= sample_width(sub)
    return width


class RepeatController(Controller):
    """Run ``controller`` ``n`` times as independent parallel branches; record each run's answer."""

    def __init__(self, n: Annotated[int, Ge(1), Help("independent runs of the controller per prompt")] = 1,
                 controller: Annotated[Any, Help("the controller each run uses (default: native)")] = None):
        self.n = n
        self.controller = _sub_controller(controller)
        inner = self.controller
        if isinstance(inner, NativeController) and inner.samples > 1:
            raise ValueError(f"controller 'native' with samples={inner.samples} names no single answer per run; "
                             "use samples: 1 (repeat runs it n times), or a controller that picks one answer "
                             "(majority_vote, best_of_n)")

    @property
    def samples(self) -> int:
        """Sample numbers all ``n`` runs may use (so a repeat inside another controller numbers apart)."""
        return self.n * sample_width(self.controller)

    async def start(self) -> None:
        await start_controller(self.controller)

    async def close(self) -> None:
        await close_controller(self.controller)

    def process(self, ctx: EpisodeContext):
        width = sample_width(self.controller)
        outcomes = yield self.parallel(self.controller, [ctx.branch(i * width) for i in range(self.n)])
        runs = [[s if isinstance(s, Sample) else Sample.from_task(s) for s in outcome.samples]
                for outcome in outcomes]
        unverified = [s for run in runs for s in run if s.verdict is None]
        if unverified:
            checks = [VerificationTask(s.text, ctx.reference) for s in unverified]
            yield checks
            for sample, check in zip(unverified, checks):
                sample.verdict = check.verdict
        samples: list[Sample] = []
        correct: list[float] = []
        for branch, (outcome, run) in enumerate(zip(outcomes, runs)):
            if not run:
                raise ControllerError(f"repeat: run {branch} of {type(self.controller).__name__} returned no sample")
            answer = branch_answer(outcome, run)
            for sample in run:
                sample.metadata["branch"] = branch
            run[0].metadata["branch_answer"] = answer
            if answer["reward"] is not None:
                correct.append(float(answer["reward"] > 0))
            samples.extend(run)
        metrics = {"answer_accuracy": sum(correct) / len(correct)} if correct else {}
        return Outcome(samples=samples, metrics=metrics)


def branch_answer(outcome: Outcome, run: list[Sample]) -> dict[str, Any]:
    """One run's answer (see the module's docstring): the chosen sample, the named answer, or the only sample."""
    if outcome.chosen is not None and 0 <= outcome.chosen < len(run):
        return _answer_of(run[outcome.chosen])
    if outcome.answer is not None or outcome.answer_reward is not None:
        same = next((s for s in run if s.verdict is not None and outcome.answer is not None
                     and s.verdict.extracted == outcome.answer), None)
        found = _answer_of(same) if same is not None else {"sample": None, "key": outcome.answer, "logprob": None}
        return {**found, "extracted": outcome.answer, "reward": outcome.answer_reward}
    if len(run) == 1:
        return _answer_of(run[0])
    raise ControllerError(f"repeat: the controller returned {len(run)} samples and named no answer (Outcome.chosen "
                          "or Outcome.answer); use a controller that picks one answer per run")


def _answer_of(sample: Sample) -> dict[str, Any]:
    verdict = sample.verdict
    return {"sample": sample.sample_index, "extracted": verdict.extracted if verdict else None,
            "key": verdict.vote_key if verdict else None, "reward": verdict.reward if verdict else None,
            "logprob": mean_logprob(sample)}


def mean_logprob(sample: Sample) -> float | None:
    """The mean behaviour logprob of the tokens the model generated, None when there are none."""
    values = [lp for lp, m in zip(sample.output_logprobs, sample.output_mask) if m]
    return round(sum(values) / len(values), 6) if values else None


@hookimpl
def register_controllers(registry):
    registry.add("repeat", RepeatController)
