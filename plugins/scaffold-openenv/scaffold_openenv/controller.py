"""The ``openenv`` controller: an OpenEnv environment, run locally, plays the other side of the conversation.

``controller: {name: openenv, environment: my_env.server.env:MyEnvironment}`` with any task: each episode makes
its own instance of the class (``env_args`` its keyword arguments), calls ``reset(seed=<the episode's seed>,
episode_id=...)`` and shows the observation's text after the task's prompt (as a user message; none when it
has no text). Then each model turn is an action (the turn's text in the action's string field,
``action_field``), given to ``step``; the observation it returns is appended as environment tokens (loss mask
0, version -1) through scaffold-multiturn's conversation machinery, so the sequence holds the engine's own ids.
The episode ends when an observation says ``done``, after ``max_turns`` or at ``max_total_tokens``.

Rewards are the environment's: each step's ``observation.reward`` is kept (``turn_rewards``; ``None``, a step
the environment did not reward, counts as none), and the episode's reward is their sum (``reward: sum``) or
the last one given (``reward: last``). An episode whose environment never gave a reward is unscored, never 0.
Environment calls run in worker threads, each bounded by ``step_timeout``.
"""

from __future__ import annotations

import asyncio
import math
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt

from scaffold_core.controller import Controller, samples_in_parallel
from scaffold_core.conversation import Conversation
from scaffold_core.episode import EpisodeContext, Outcome, Sample
from scaffold_core.errors import EpisodeError
from scaffold_core.generation import AwaitTask
from scaffold_core.plugins import Help
from scaffold_core.tokenizers import render_chat
from scaffold_core.verifier import Verdict

from .environment import action_type, environment_class, observation_text, text_field


class OpenEnvController(Controller):
    """Model turns against a local OpenEnv environment (see the module docstring).

    Options: ``environment`` (``module:Class``), ``env_args`` (its keyword arguments), ``action_field`` and
    ``observation_field`` (default: the model's only string field), ``max_turns`` (5), ``reward`` (``sum`` or
    ``last``), ``max_total_tokens``, ``step_timeout`` (120 s), ``samples`` (1).
    """

    def __init__(self, environment: str, env_args: dict[str, Any] | None = None, action_field: str | None = None,
                 observation_field: str | None = None,
                 max_turns: Annotated[int, Ge(1), Help("model turns per episode")] = 5,
                 reward: Annotated[Literal["sum", "last"], Help("the steps' rewards summed, or the last")] = "sum",
                 max_total_tokens: Annotated[int, Ge(2)] | None = None,
                 step_timeout: Annotated[float, Gt(0), Help("seconds one environment step may take")] = 120.0,
                 samples: Annotated[int, Ge(1), Help("episodes per prompt")] = 1):
        self.environment = environment
        self.env_class = environment_class(environment)
        self.action_cls = action_type(self.env_class)
        self.action_field = text_field(self.action_cls, action_field, "action")
        self.observation_field = observation_field
        self.env_args = dict(env_args or {})
        self.max_turns = max_turns
        self.reward = reward
        self.max_total_tokens = max_total_tokens
        self.step_timeout = step_timeout
        self.samples = samples

    def process(self, ctx: EpisodeContext):
        if self.samples == 1:
            sample, metrics = yield from self.play(ctx)
            return Outcome(samples=[sample], chosen=0, metrics=metrics)
        return (yield from samples_in_parallel(self, ctx))

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> AwaitTask:
        return AwaitTask(lambda: asyncio.to_thread(fn, *args, **kwargs), timeout=self.step_timeout,
                         component="environment", what=f"OpenEnv environment {self.env_class.__name__}: {what}")

    def play(self, ctx: EpisodeContext):
        """One conversation with a fresh environment; returns (its Sample, its metrics)."""
        if ctx.messages is None or ctx.tokenizer is None:
            raise EpisodeError("openenv needs the task's prompt as chat messages and the engine's tokenizer",
                               component="task")
        made = self._call("making it", self.env_class, **self.env_args)
        yield [made]
        env = made.result
        try:
            return (yield from self._converse(ctx, env))
        finally:
            close = getattr(env, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - closing is best effort once the reward is known
                    pass

    def _converse(self, ctx: EpisodeContext, env: Any):
        reset = self._call("reset", env.reset, seed=self._seed(ctx), episode_id=ctx.episode_id)
        yield [reset]
        messages = [dict(m) for m in ctx.messages or []]
        opening = observation_text(reset.result, self.observation_field)
        if opening.strip():
            messages.append({"role": "user", "content": opening})
            text, ids = render_chat(ctx.tokenizer, messages)
            conv = Conversation(ctx.tokenizer, messages, ids, text)
        else:
            conv = Conversation(ctx.tokenizer, messages, ctx.prompt_ids, ctx.prompt_text)
        rewards: list[float | None] = []
        end = "max_turns"
        for turn in range(self.max_turns):
            sampling = ctx.sampling
            if self.max_total_tokens is not None:
                sampling = sampling.replace(max_tokens=max(1, min(sampling.max_tokens,
                                                                  self.max_total_tokens - len(conv))))
            task = ctx.generation_task(0, prompt_ids=conv.ids, sampling=sampling, turn=turn)
            yield [task]
            model_turn = conv.add_model_turn(task.need_result())
            action = self.action_cls(**{self.action_field: model_turn.text})
            stepped = self._call("step", env.step, action)
            yield [stepped]
            observation = stepped.result
            reward = getattr(observation, "reward", None)
            if isinstance(reward, bool) or (reward is not None and not isinstance(reward, (int, float))):
                raise EpisodeError(f"OpenEnv environment {self.env_class.__name__}: step() gave reward {reward!r}; "
                                   "a number or None is needed", component="environment")
            rewards.append(None if reward is None else float(reward))
            if getattr(observation, "done", False):
                end = "done"
                break
            if turn + 1 == self.max_turns:
                break
            shown = [{"role": "user", "content": observation_text(observation, self.observation_field)}]
            ids, text = conv.environment_tokens(shown)
            if self.max_total_tokens is not None and len(conv) + len(ids) >= self.max_total_tokens:
                end = "context"
                break
            conv.add_environment(shown, ids, text)
        return self._finish(ctx, conv, rewards, end)

    @staticmethod
    def _seed(ctx: EpisodeContext) -> int:
        """The seed ``reset`` gets: the episode's (derived from the run's seed and the row), in 31 bits."""
        return ctx.seed % (2**31)

    def _finish(self, ctx: EpisodeContext, conv: Conversation, rewards: list[float | None],
                end: str) -> tuple[Sample, dict[str, float]]:
        given = [r for r in rewards if r is not None and math.isfinite(r)]
        name = self.env_class.__name__
        if not given:
            verdict = Verdict.unscored(f"OpenEnv environment {name} gave no reward ({end} after {len(rewards)} "
                                       "step(s))")
        else:
            total = sum(given) if self.reward == "sum" else given[-1]
            verdict = Verdict(total, reason=f"OpenEnv environment {name}: {end} after {len(rewards)} step(s), "
                                            f"rewards {rewards}, {self.reward} {total:g}")
        last = conv.turns[-1]
        sample = Sample(
            prompt_ids=list(conv.prompt_ids), output_ids=conv.output_ids, output_logprobs=conv.output_logprobs,
            output_mask=conv.output_mask, text=last.text, finish_reason=last.finish_reason,
            sample_index=ctx.sample_base, weight_version=conv.turns[0].weight_version, verdict=verdict,
            turn_rewards=[r if r is not None else 0.0 for r in rewards],
            metadata={"turns": [t.to_dict(len(conv.prompt_ids)) for t in conv.turns], "end": end,
                      "environment": self.environment, "step_rewards": rewards, "reset_seed": self._seed(ctx),
                      "messages": conv.messages[len(ctx.messages or []):]})
        return sample, {"turns": float(len(conv.turns)), "env_done": float(end == "done")}
