"""The ``multiturn_chat`` controller: the model speaks, the environment answers, until done or ``max_turns``."""

from __future__ import annotations

import copy
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le

from scaffold_core.controller import Controller, samples_in_parallel
from scaffold_core.conversation import Conversation, DriftReport
from scaffold_core.environment import EnvironmentFailure, EnvStep, run_step
from scaffold_core.episode import EpisodeContext, Outcome, Sample
from scaffold_core.errors import ConfigError, EpisodeError, PluginLoadError, UnknownComponentError
from scaffold_core.generation import VerificationTask
from scaffold_core.plugins import Help
from scaffold_core.verifier import Verdict


def build_environment(spec: Any) -> tuple[Any, str]:
    """(environment, name) from a registered name, a ``{name: ..., options...}`` mapping, or an object."""
    if spec is None:
        from scaffold_core.plugins import current_registry

        names = ", ".join(current_registry().names("environment")) or "(none installed)"
        raise ValueError(f"multiturn_chat needs an environment: set controller.environment to one of: {names} "
                         "(e.g. environment: {name: verifier_feedback})")
    from scaffold_core.plugins import current_registry

    try:
        env = current_registry().build("environment", spec, path="controller.environment",
                                       accepts=lambda obj: hasattr(obj, "step"))
    except (UnknownComponentError, PluginLoadError) as exc:
        raise ConfigError(str(exc)) from exc
    if env is spec:
        return spec, type(spec).__name__
    name = spec if isinstance(spec, str) else spec["name"]
    if not callable(getattr(env, "step", None)):
        raise ValueError(f"environment {name!r} built a {type(env).__name__}, which has no step() method")
    return env, name


def discounted(reward: float, turns: int, turn_discount: float) -> float:
    """The episode's reward: the final verdict's reward times ``turn_discount ** (turns - 1)``."""
    return float(reward) * turn_discount ** max(0, turns - 1)


class MultiTurnChatController(Controller):
    """A conversation loop: the model speaks, the environment answers, until it says done or ``max_turns``.

    Options:

    * ``environment``: a registered environment name, or ``{name: ...,
      options...}`` (required; tasks such as ``multiturn_gsm8k`` set one).
    * ``max_turns`` (3): model turns at most. The environment answers every
      turn but the last allowed one, which only the verifier scores.
    * ``turn_discount`` (1.0): the episode's reward is the final verdict's
      reward times ``turn_discount ** (turns - 1)``.
    * ``samples`` (1): independent conversations per prompt, run
      concurrently (each its own training sequence, e.g. for GRPO).
    * ``max_total_tokens`` (none): the conversation stops (``context``)
      rather than grow past this many tokens; each turn's ``max_tokens`` is
      clamped to the room left.
    * ``drift_check`` (true): compare the accumulated ids with a fresh render
      of the whole conversation; reported as ``drift`` metrics.
    * ``environment_timeout`` (600 s): bound on an async environment step.

    The episode is one :class:`~scaffold_core.Sample` whose ``output_ids``
    interleave model turns (mask 1) and environment turns (mask 0).

    Every episode's clone shares the environment (declared in ``shared``: it
    keeps per-conversation state in what ``reset`` returns, never on itself);
    everything else is copied per episode.
    """

    shared = ("environment",)

    def __init__(self, environment: str | dict[str, Any] | None = None,
                 max_turns: Annotated[int, Ge(1), Help("model turns per episode")] = 3,
                 turn_discount: Annotated[float, Ge(0), Le(1), Help("a later turn's reward weight")] = 1.0,
                 samples: Annotated[int, Ge(1), Help("conversations per prompt, run concurrently")] = 1,
                 max_total_tokens: Annotated[int, Ge(2), Help("the conversation's tokens (null: no limit)")] | None
                 = None,
                 drift_check: bool = True,
                 environment_timeout: Annotated[float, Gt(0), Help("seconds one environment step may take")] = 600.0):
        self.environment, self.environment_name = build_environment(
            copy.deepcopy(environment) if isinstance(environment, dict) else environment)
        self.max_turns = max_turns
        self.turn_discount = turn_discount
        self.samples = samples
        self.max_total_tokens = max_total_tokens
        self.drift_check = drift_check
        self.environment_timeout = environment_timeout

    async def start(self) -> None:
        start = getattr(self.environment, "start", None)
        if start is not None:
            await start()

    async def close(self) -> None:
        close = getattr(self.environment, "close", None)
        if close is not None:
            await close()

    # -- episodes --------------------------------------------------------
    def process(self, ctx: EpisodeContext):
        if self.samples == 1:
            sample, metrics = yield from self.converse(ctx)
            return Outcome(samples=[sample], chosen=0, metrics=metrics)
        return (yield from samples_in_parallel(self, ctx))

    def converse(self, ctx: EpisodeContext):
        """One conversation; returns (its Sample, its metrics)."""
        if ctx.messages is None:
            raise EpisodeError("multiturn_chat needs the task's prompt as chat messages, and this task built its "
                               "prompt without them (override messages(row) instead of build_prompt)",
                               component="task")
        if ctx.tokenizer is None:
            raise EpisodeError("multiturn_chat needs the engine's tokenizer in the episode context", component="task")
        conv = Conversation(ctx.tokenizer, ctx.messages, ctx.prompt_ids, ctx.prompt_text)
        if self.max_total_tokens is not None and len(conv) >= self.max_total_tokens:
            raise EpisodeError(f"the prompt has {len(conv)} tokens, no fewer than controller.max_total_tokens "
                               f"({self.max_total_tokens}): raise max_total_tokens or shorten the prompt",
                               component="task")
        try:
            state = self.environment.reset(ctx)
        except EpisodeError:
            raise
        except Exception as exc:
            raise EnvironmentFailure(
                f"environment {self.environment_name!r} raised {type(exc).__name__} in reset: {exc}") from exc
        steps: list[EnvStep] = []
        end = "max_turns"
        for turn in range(self.max_turns):
            sampling = ctx.sampling
            if self.max_total_tokens is not None:
                sampling = sampling.replace(max_tokens=min(sampling.max_tokens, self.max_total_tokens - len(conv)))
            task = ctx.generation_task(0, prompt_ids=conv.ids, sampling=sampling, turn=turn)
            yield [task]
            model_turn = conv.add_model_turn(task.need_result())
            if turn + 1 == self.max_turns:
                break  # the last turn allowed: the verifier scores it; the environment is not asked to reply
            step = yield from run_step(self.environment, self.environment_name, state, model_turn.text,
                                       timeout=self.environment_timeout)
            steps.append(step)
            if step.done:
                end = "done"
                break
            ids, text = conv.environment_tokens(step.messages or [])
            if self.max_total_tokens is not None and len(conv) + len(ids) >= self.max_total_tokens:
                end = "context"
                break
            conv.add_environment(step.messages or [], ids, text)

        final, turn_rewards = yield from self._score(ctx, conv, steps)
        report = conv.drift() if self.drift_check else None
        last = conv.turns[-1]
        metadata: dict[str, Any] = {
            "turns": [t.to_dict(len(conv.prompt_ids)) for t in conv.turns],
            "end": end,
            "messages": conv.messages[len(ctx.messages):],
            "environment": self.environment_name,
        }
        infos = [s.info for s in steps]
        if any(infos):
            metadata["environment_info"] = infos
        if report is not None:
            metadata["drift"] = report.to_dict()
        sample = Sample(
            prompt_ids=list(ctx.prompt_ids), output_ids=conv.output_ids, output_logprobs=conv.output_logprobs,
            output_mask=conv.output_mask, text=last.text, finish_reason=last.finish_reason,
            sample_index=ctx.sample_base, weight_version=conv.turns[0].weight_version, verdict=final,
            turn_rewards=turn_rewards, metadata=metadata, versions=conv.output_versions,
        )
        return sample, self._metrics(len(conv.turns), end, report)

    def _score(self, ctx: EpisodeContext, conv: Conversation, steps: list[EnvStep]):
        """(the episode's discounted Verdict, per-turn rewards); verifies the last turn unless the environment did."""
        scored = len(steps) == len(conv.turns)  # the environment answered the last turn
        verdict = steps[-1].verdict if scored else None
        if verdict is None:
            check = VerificationTask(conv.turns[-1].text, ctx.reference)
            yield [check]
            verdict = check.need_verdict()
        turns = len(conv.turns)
        reward = discounted(verdict.reward, turns, self.turn_discount)
        reason = verdict.reason + (f"; turn {turns} of {self.max_turns}, x{self.turn_discount ** (turns - 1):g}"
                                   if turns > 1 and self.turn_discount != 1.0 else "")
        turn_rewards = [float(s.reward) if s.reward is not None else (s.verdict.reward if s.verdict else 0.0)
                        for s in steps]
        if not scored:
            turn_rewards.append(float(verdict.reward))
        elif steps[-1].reward is None and steps[-1].verdict is None:
            turn_rewards[-1] = float(verdict.reward)
        return Verdict(reward, verdict.extracted, verdict.key, reason), turn_rewards

    def _metrics(self, turns: int, end: str, report: DriftReport | None) -> dict[str, float]:
        metrics = {"turns": float(turns), "max_turns_reached": float(end == "max_turns")}
        if report is not None:
            metrics["drift"] = float(report.drift)
            metrics["drift_template"] = float(report.kind == "template")
            metrics["drift_boundary"] = float(report.kind == "boundary")
            metrics["retokenize_mismatch"] = float(bool(report.noncanonical_turns))
        return metrics
