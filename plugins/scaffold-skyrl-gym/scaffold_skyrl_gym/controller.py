"""The ``gym_env`` controller: a skyrl-gym environment plays the other side of the conversation.

Each episode makes its own environment (``env_class`` of the row, else the ``env`` option), calls
``init`` with the prompt messages, then alternates: the model's turn is the action given to ``step``;
the observations it returns are appended as environment tokens (loss mask 0, logprob 0.0, version -1)
through scaffold-multiturn's :class:`~scaffold_core.conversation.Conversation`, so the sequence
is the engine's own ids and the rendered observations, never re-tokenized model text. The episode ends
when the environment says ``done``, after ``max_turns`` steps, or when ``max_total_tokens`` runs out.

Every step's reward is kept (``turn_rewards``: one per model turn); the episode's reward is their sum
(``reward: sum``, SkyRL's token-in/token-out convention, where each step's reward sits on its turn's last
token) or the last step's (``reward: last``). The environment computes it; no verifier runs.

Environment calls are blocking Python (SQL, subprocesses), so each runs in a worker thread, bounded by
``step_timeout``: a step that runs past it fails the episode (component ``environment``); Python cannot
stop the thread, which finishes on its own.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt

from scaffold_core.controller import Controller, samples_in_parallel
from scaffold_core.conversation import Conversation, DriftReport
from scaffold_core.episode import EpisodeContext, Outcome, Sample
from scaffold_core.errors import EpisodeError
from scaffold_core.generation import AwaitTask
from scaffold_core.plugins import Help
from scaffold_core.tokenizers import render_chat
from scaffold_core.verifier import Verdict

from .envs import GymEnvFailure, Step, check_step, close_quietly, make_env, numeric_metrics


class GymEnvController(Controller):
    """Model turns against a skyrl-gym environment (see the module docstring).

    Options:

    * ``env`` (none): the environment of rows that name none (``env_class``); e.g. ``gsm8k`` paired with
      any task whose reference is the ground truth.
    * ``env_args`` (``{}``): the environment's config (``env_config``) for rows that carry none.
    * ``max_turns`` (5): model turns at most; also given to the environment as ``extras.max_turns``.
    * ``reward`` (``sum``): the episode's reward, the sum of the step rewards or the ``last`` one.
    * ``max_total_tokens`` (none): the conversation never grows past this many tokens.
    * ``step_timeout`` (120 s): bound on one ``init``/``step`` call.
    * ``env_threads`` (32): worker threads the run's environment calls share (started with the run), so
      calls of concurrent episodes do not wait for each other's slow steps.
    * ``samples`` (1): independent conversations per prompt, run concurrently.
    * ``drift_check`` (true): compare the ids with a fresh render of the whole conversation.
    """

    shared = ("_executor",)

    def __init__(self, env: str | None = None, env_args: dict[str, Any] | None = None,
                 max_turns: Annotated[int, Ge(1), Help("model turns per episode")] = 5,
                 reward: Annotated[Literal["sum", "last"], Help("the steps' rewards summed, or the last")] = "sum",
                 max_total_tokens: Annotated[int, Ge(2), Help("the conversation's tokens (null: no limit)")] | None
                 = None,
                 step_timeout: Annotated[float, Gt(0), Help("seconds one environment step may take")] = 120.0,
                 env_threads: Annotated[int, Ge(1), Help("threads the environments' steps run on")] = 32,
                 samples: Annotated[int, Ge(1), Help("conversations per prompt, run concurrently")] = 1,
                 drift_check: bool = True):
        self.env = env
        self.env_args = dict(env_args or {})
        self.max_turns = max_turns
        self.reward = reward
        self.max_total_tokens = max_total_tokens
        self.step_timeout = step_timeout
        self.samples = samples
        self.drift_check = drift_check
        self.env_threads = env_threads
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """The worker threads of the run's environment calls."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.env_threads, thread_name_prefix="gym-env")

    async def close(self) -> None:
        """Let the worker threads go (a step still running finishes on its own). Safe twice."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def process(self, ctx: EpisodeContext):
        if self.samples == 1:
            sample, metrics = yield from self.play(ctx)
            return Outcome(samples=[sample], chosen=0, metrics=metrics)
        return (yield from samples_in_parallel(self, ctx))

    # -- one episode --------------------------------------------------------------------------
    def _in_thread(self, what: str, fn: Any, *args: Any) -> AwaitTask:
        executor = self._executor

        def call() -> Any:
            if executor is None:  # a controller used without start(): the loop's default threads
                return asyncio.to_thread(fn, *args)
            return asyncio.get_running_loop().run_in_executor(executor, fn, *args)

        return AwaitTask(call, timeout=self.step_timeout, component="environment", what=what)

    def _spec(self, ctx: EpisodeContext) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(environment id, its config, its extras) for this episode."""
        row = ctx.row
        env_id = row.get("env_class") or self.env
        if not env_id:
            raise EpisodeError("gym_env: the row names no environment (env_class) and controller.env is not set: "
                               "set controller.env (e.g. env: gsm8k) or use the skyrl_gym task", component="task")
        extras = row.get("extras")
        if not isinstance(extras, dict):
            ground_truth = ctx.reference if isinstance(ctx.reference, (str, int, float)) else None
            extras = {} if ground_truth is None else {"reward_spec": {"method": "rule",
                                                                     "ground_truth": str(ground_truth)}}
        config = row.get("env_config")
        config = config if isinstance(config, dict) else self.env_args
        return str(env_id), dict(config), {**extras, "max_turns": self.max_turns}

    def play(self, ctx: EpisodeContext):
        """One conversation with a fresh environment; returns (its Sample, its metrics)."""
        if ctx.messages is None or ctx.tokenizer is None:
            raise EpisodeError("gym_env needs the task's prompt as chat messages and the engine's tokenizer",
                               component="task")
        env_id, config, extras = self._spec(ctx)
        made = self._in_thread(f"making environment {env_id!r}", make_env, env_id, config, extras)
        yield [made]
        env = made.result
        try:
            return (yield from self._converse(ctx, env_id, env))
        finally:
            threading.Thread(target=close_quietly, args=(env,), daemon=True).start()

    def _begin(self, ctx: EpisodeContext, env_id: str, env: Any):
        init = self._in_thread(f"environment {env_id!r} init", env.init, [dict(m) for m in ctx.messages or []])
        yield [init]
        out = init.result
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], list)):
            raise GymEnvFailure(f"environment {env_id!r}: init() must return (prompt messages, info), got {out!r}")
        messages = [dict(m) for m in out[0]]
        if messages == list(ctx.messages or []):
            return Conversation(ctx.tokenizer, messages, ctx.prompt_ids, ctx.prompt_text)
        text, ids = render_chat(ctx.tokenizer, messages)  # the environment rewrote the prompt
        return Conversation(ctx.tokenizer, messages, ids, text)

    def _converse(self, ctx: EpisodeContext, env_id: str, env: Any):
        conv = yield from self._begin(ctx, env_id, env)
        if self.max_total_tokens is not None and len(conv) >= self.max_total_tokens:
            raise EpisodeError(f"the prompt has {len(conv)} tokens, no fewer than controller.max_total_tokens "
                               f"({self.max_total_tokens})", component="task")
        steps: list[Step] = []
        end = "max_turns"
        for turn in range(self.max_turns):
            sampling = ctx.sampling
            if self.max_total_tokens is not None:
                sampling = sampling.replace(max_tokens=max(1, min(sampling.max_tokens,
                                                                  self.max_total_tokens - len(conv))))
            task = ctx.generation_task(0, prompt_ids=conv.ids, sampling=sampling, turn=turn)
            yield [task]
            model_turn = conv.add_model_turn(task.need_result())
            stepped = self._in_thread(f"environment {env_id!r} step", env.step, model_turn.text)
            yield [stepped]
            step = check_step(env_id, stepped.result)
            steps.append(step)
            if step.done:
                end = "done"
                break
            if turn + 1 == self.max_turns:
                break
            ids, text = conv.environment_tokens(step.observations)
            if self.max_total_tokens is not None and len(conv) + len(ids) >= self.max_total_tokens:
                end = "context"
                break
            conv.add_environment(step.observations, ids, text)
        return self._finish(ctx, env_id, env, conv, steps, end)

    def _finish(self, ctx: EpisodeContext, env_id: str, env: Any, conv: Conversation, steps: list[Step],
                end: str) -> tuple[Sample, dict[str, float]]:
        rewards = [s.reward for s in steps]
        reward = sum(rewards) if self.reward == "sum" else rewards[-1]
        shown = ", ".join(f"{r:g}" for r in rewards)
        verdict = Verdict(float(reward), reason=f"environment {env_id}: {end} after {len(steps)} step(s), "
                                                f"step rewards [{shown}], {self.reward} {reward:g}")
        report = conv.drift() if self.drift_check else None
        last = conv.turns[-1]
        metadata: dict[str, Any] = {
            "turns": [t.to_dict(len(conv.prompt_ids)) for t in conv.turns],
            "end": end,
            "environment": env_id,
            "messages": conv.messages[len(ctx.messages or []):],
            "step_rewards": rewards,
            "step_metadata": [s.metadata for s in steps],
        }
        if report is not None:
            metadata["drift"] = report.to_dict()
        sample = Sample(
            prompt_ids=list(conv.prompt_ids), output_ids=conv.output_ids, output_logprobs=conv.output_logprobs,
            output_mask=conv.output_mask, text=last.text, finish_reason=last.finish_reason,
            sample_index=ctx.sample_base, weight_version=conv.turns[0].weight_version, verdict=verdict,
            turn_rewards=rewards, metadata=metadata,
        )
        return sample, self._metrics(len(conv.turns), end, report, numeric_metrics(env))

    def _metrics(self, turns: int, end: str, report: DriftReport | None,
                 env_metrics: dict[str, float]) -> dict[str, float]:
        metrics = {"turns": float(turns), "env_done": float(end == "done"),
                   "max_turns_reached": float(end == "max_turns"), "context_exhausted": float(end == "context")}
        if report is not None:
            metrics["drift"] = float(report.drift)
            metrics["retokenize_mismatch"] = float(bool(report.noncanonical_turns))
        metrics.update(env_metrics)
        return metrics
