"""The ``verifiers_rollout`` controller: a verifiers environment's own rollout, on scaffold's engine, token-faithful.

``controller: {name: verifiers_rollout}`` (the ``verifiers`` task's default). Single-turn environments are
played as ``native`` plays any task (one generation per sample, scored by the ``verifiers`` verifier). Every
other environment (an ``Env`` of its own, a harness, tools, judges) is played by the library itself: for
each episode the controller opens a session on a loopback endpoint it serves for the run
(:mod:`scaffold_serve.episodes`, the machinery of the ``openai_agent`` controller), and runs
``Env.run_episode(task, ModelContext(...))`` with the session as the model's endpoint. The library's
harness program, tool servers, user simulators and game engines run as the library runs them; each model
call they make reaches the session, which generates it through the episode's runtime (the run's engine,
seeds, request hooks, weight versions) and records the ids the engine sampled.

When the episode ends, the library has scored each of its traces (``Task.score``: the weighted
``@vf.reward`` functions, ``@vf.metric`` functions and plugged judges; then ``Env.finalize``). Each
conversation of the session is one sample (model tokens loss mask 1; tool results, user and environment
turns 0, version -1), scored by the trace that made it (the library names its agent run in every call's
``X-Session-ID`` header, which the session records): the trace's reward is the sample's, and each reward and
metric function's value is in the sample's verdict metrics, as on the single-turn path. Traces the
environment marks untrainable (a judge seat) and attempts the library retried give no samples. Judges'
model calls go where the ``judge`` option says (:mod:`scaffold_verifiers.judges`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import time
from typing import Annotated, Any

from annotated_types import Ge

from scaffold_core.builtins.controllers import NativeController
from scaffold_core.episode import EpisodeContext, Outcome
from scaffold_core.errors import ConfigError, EpisodeError
from scaffold_core.generation import AwaitTask
from scaffold_core.plugins import Help, current_path
from scaffold_serve import AgentSampling, AgentTimeout, ContextLength, MaxCalls

from .environment import check_rollout
from .jail_runtime import jailed_task_class
from .judges import JudgeEndpoint, bind_judges, count_judges, parse_judge_option
from .task import TASK_KEY
from .verifier import loaded_environment, verdict_of

#: The header verifiers' clients name their agent run (trace) in, on every model call.
TRACE_HEADER = "X-Session-ID"
#: How long starting an environment (its shared tool servers, the library's interception server) may take.
START_TIMEOUT = 300.0


class Environments:
    """What one run shares across its episodes: the endpoint, its key's environment variable, the started
    ``Env`` objects (each entered into its ``serving()`` context once, left at the end of the run)."""

    def __init__(self, options: Any, tool_format: Any):
        self.options = options
        self.tool_format = tool_format
        self.endpoint: Any = None
        self.key_var = f"SCAFFOLD_VERIFIERS_API_KEY_{secrets.token_hex(4)}"
        self.envs: dict[str, Any] = {}
        self.judges: dict[str, int] = {}
        self.stack = contextlib.AsyncExitStack()
        self.lock: asyncio.Lock | None = None

    async def env(self, reference: dict[str, Any]) -> tuple[Any, int]:
        """The started ``Env`` for a row's environment and how many judges its task config holds (the endpoint
        started on the first call)."""
        if self.lock is None:
            self.lock = asyncio.Lock()
        key = json.dumps([reference["env"], reference.get("env_args"), reference["rollout"]], sort_keys=True,
                         default=str)
        async with self.lock:
            if self.endpoint is None:
                await self._start_endpoint()
            if key not in self.envs:
                env = await asyncio.to_thread(_build_env, reference)
                await self.stack.enter_async_context(env.serving())
                self.envs[key] = env
                self.judges[key] = count_judges(env.taskset.config.task)
            return self.envs[key], self.judges[key]

    async def _start_endpoint(self) -> None:
        from scaffold_serve import AgentEndpoint

        from .program import run_chat_program_here

        await asyncio.to_thread(run_chat_program_here)
        self.endpoint = await AgentEndpoint.start(self.options, self.tool_format)
        # verifiers clients read their key from an environment variable; its name holds API_KEY, which the
        # library's subprocess runtime keeps out of the programs it starts (the harness gets its own secret)
        os.environ[self.key_var] = self.endpoint.api_key
        self.stack.callback(os.environ.pop, self.key_var, None)
        self.stack.push_async_callback(self.endpoint.close)

    async def close(self) -> None:
        await self.stack.aclose()
        self.envs.clear()


def _build_env(reference: dict[str, Any]) -> Any:
    from verifiers.v1.utils.loaders import load_environment

    loaded = loaded_environment(str(reference["env"]), dict(reference.get("env_args") or {}))
    spec = reference["rollout"]
    return load_environment(check_rollout(loaded, spec["harness"], spec.get("env_config")))


class VerifiersRolloutController(NativeController):
    """Play verifiers environments (see the module docstring).

    Options:

    * ``samples`` (1): independent episodes per prompt, run concurrently (each its own session).
    * ``judge`` (``same``): where judges call: ``same`` (the run's model through a side session, never
      trained on), ``env`` (the environment's own judge config) or ``{base_url, model, api_key_var}``.
    * ``timeout`` (600): seconds one episode (the library's whole rollout and scoring) may take.
    * ``sampling`` (``config``): ``config``: the run's ``sampling`` section decides temperature, top_p, top_k
      and seeds (a harness's ``max_tokens`` can only lower it); ``request``: the harness's parameters win.
    * ``tool_format`` (``hermes``): how the harness's tools reach the model and its calls come back.
    * ``model_name`` (``scaffold``), ``max_calls`` (256 per episode), ``context_length`` (the tokenizer's):
      as for ``openai_agent``.
    """

    shared = ("environments", "options", "_format")

    def __init__(self, samples: Annotated[int, Ge(1), Help("episodes per prompt")] = 1, judge: Any = "same",
                 timeout: AgentTimeout = 600.0, sampling: AgentSampling = "config",
                 tool_format: str | dict[str, Any] = "hermes", model_name: str = "scaffold", max_calls: MaxCalls = 256,
                 context_length: ContextLength | None = None):
        super().__init__(samples)
        from scaffold_core.plugins import build_tool_format as build_format
        from scaffold_serve import ServeOptions

        self.judge = parse_judge_option(judge)
        self.timeout = float(timeout)
        self.model_name = model_name
        self.options = ServeOptions(model_name=model_name, sampling_from=sampling, max_calls=max_calls,
                                    context_length=context_length, tag_header=TRACE_HEADER)
        self.environments: Environments | None = None
        self._format = build_format(tool_format, f"{current_path('controller')}.tool_format")

    async def start(self) -> None:
        if self.environments is None:
            self.environments = Environments(self.options, self._format)

    async def close(self) -> None:
        environments, self.environments = self.environments, None
        if environments is not None:
            await environments.close()

    # -- episodes ---------------------------------------------------------------------------------------
    def process(self, ctx: EpisodeContext):
        reference = ctx.reference
        if not isinstance(reference, dict) or TASK_KEY not in reference or "env" not in reference:
            raise ConfigError("the verifiers_rollout controller plays the verifiers task's rows: use task: "
                              "{name: verifiers, env: ...}")
        if not reference.get("rollout"):
            return (yield from NativeController.process(self, ctx))
        if self.samples > 1:
            from scaffold_core.controller import samples_in_parallel

            return (yield from samples_in_parallel(self, ctx))
        return (yield from self._play(ctx, reference))

    def _play(self, ctx: EpisodeContext, reference: dict[str, Any]):
        from scaffold_serve import EpisodeSessions

        environments = self.environments
        if environments is None:
            raise EpisodeError("the verifiers_rollout controller was not started", component="controller")
        env_id = str(reference["env"])
        starting = AwaitTask(lambda: environments.env(reference), timeout=START_TIMEOUT, component="environment",
                             what=f"starting verifiers environment {env_id!r}")
        yield [starting]
        env, judges = starting.result
        episode = EpisodeSessions(environments.endpoint, ctx, what=f"verifiers environment {env_id!r}")
        started = time.monotonic()
        try:
            task = self._task(env, reference, episode, judges, environments.key_var)
            model = _model_context(self.model_name, episode.base_url(), environments.key_var)
            run = yield from episode.run(lambda: env.run_episode(task, model), self.timeout)
            played = _played(run, env, env_id)
        finally:
            episode.close()
        return _outcome(episode, played, ctx, env_id, time.monotonic() - started)

    def _task(self, env: Any, reference: dict[str, Any], episode: Any, judges: int, key_var: str) -> Any:
        """The row's task, its judges pointed where the ``judge`` option says."""
        config = env.taskset.config.task
        if judges and self.judge == "same":
            side = episode.side_session("judge")
            config = bind_judges(config, JudgeEndpoint(episode.base_url(side), self.model_name, key_var))
        elif judges and isinstance(self.judge, JudgeEndpoint):
            config = bind_judges(config, self.judge)
        task_cls = type(env.taskset).task_type()
        built = task_cls if reference.get("code_execution") == "host" else jailed_task_class(task_cls)
        try:
            return built(task_cls.data_type().model_validate(reference[TASK_KEY]), config)
        except Exception as exc:
            raise EpisodeError(f"verifiers environment {reference['env']!r}: the row's task cannot be rebuilt: "
                               f"{type(exc).__name__}: {exc}", component="task") from exc


def _model_context(model: str, base_url: str, key_var: str) -> Any:
    from verifiers.v1 import EvalClientConfig, ModelContext

    return ModelContext(model=model, client=EvalClientConfig(base_url=base_url, api_key_var=key_var))


def _played(run: asyncio.Future, env: Any, env_id: str) -> Any:
    """The library's finished episode; EpisodeError naming the environment's error when it did not complete."""
    if run.cancelled():
        raise EpisodeError(f"verifiers environment {env_id!r}: the episode was cancelled", component="environment")
    error = run.exception()
    if error is not None:
        raise EpisodeError(f"verifiers environment {env_id!r} raised {type(error).__name__}: {error}",
                           component="environment") from error
    played = run.result()
    if not env.complete(played):
        errors = [*played.errors, *(e for trace in played.traces for e in trace.errors)]
        why = f"{errors[0].type}: {' '.join(str(errors[0].message).split())[:500]}" if errors else "no reason given"
        raise EpisodeError(f"verifiers environment {env_id!r}: the episode failed ({why})", component="environment")
    return played


def _outcome(episode: Any, played: Any, ctx: EpisodeContext, env_id: str, seconds: float) -> Outcome:
    """Each conversation of the episode's session as one sample, scored by the library's trace that made it.

    Every trainable seat (trace) is kept in the figures: one that acted gives its samples; one that never made
    a model call (its opponent forfeited first) gives none and is counted (``idle_seats``). Each seat's reward is
    an episode metric (``seat_reward/<agent>``, averaged over the episode's traces of that agent), and
    ``seat_reward_mean`` averages every trainable seat, acted or not: 0 for a zero-sum game."""
    session = episode.session
    traces = {trace.id: trace for trace in played.traces}
    trainable = [t for t in played.traces if t.agent is None or t.agent.trainable]
    trainable_ids = {t.id for t in trainable}
    if not session.trajectories:
        raise EpisodeError(f"verifiers environment {env_id!r}: the episode made no model call through its session",
                           component="environment")
    samples: list[Any] = []
    chosen: int | None = None
    skipped = 0
    acted: set[str] = set()
    final = trainable[-1] if trainable else None
    for trajectory in session.trajectories:
        trace = traces.get(trajectory.tags[0]) if trajectory.tags else (
            played.traces[0] if len(played.traces) == 1 else None)
        if trace is None or trace.id not in trainable_ids:
            skipped += 1  # a retried attempt's calls, or an untrainable seat's (a judge agent)
            continue
        verdict = verdict_of(trace)
        meta = {"session": session.id, "env": env_id, "trace": trace.id, "agent": _agent_name(trace),
                "calls": session.counts["calls"]}
        # the conversations of one agent run (a client that rewrote its history splits it) are one rollout
        samples.append(trajectory.sample(trace.last_reply, verdict, ctx.sample_base + len(samples), meta,
                                         rollout=f"{ctx.sample_base}/{trace.id}"))
        acted.add(trace.id)
        if trace is final:
            chosen = len(samples) - 1
    if not samples:
        raise EpisodeError(f"verifiers environment {env_id!r}: no trainable agent run made a model call",
                           component="environment")
    judge_calls = sum(side.counts["calls"] for side in episode.side)
    metrics = {"agent_calls": float(session.counts["calls"]), "agent_trajectories": float(len(samples)),
               "drift": float(session.drift_count), "forks": float(session.counts["fork"]),
               "traces": float(len(played.traces)), "turns": float(sum(t.num_turns for t in played.traces)),
               "judge_calls": float(judge_calls), "skipped_trajectories": float(skipped), "agent_s": seconds,
               **_seat_metrics(trainable, acted)}
    answer = final.last_reply if final is not None else None
    reward = float(final.reward) if final is not None else None
    return Outcome(samples=samples, chosen=chosen, answer=answer, answer_reward=reward, metrics=metrics)


def _seat_metrics(trainable: list[Any], acted: set[str]) -> dict[str, float]:
    """``seats``, ``idle_seats``, ``seat_reward_mean`` and ``seat_reward/<agent>`` of an episode's trainable traces."""
    by_agent: dict[str, list[float]] = {}
    rewards: list[float] = []
    for trace in trainable:
        reward = trace.reward
        if reward is None or not math.isfinite(float(reward)):
            continue
        rewards.append(float(reward))
        by_agent.setdefault(_agent_name(trace) or "agent", []).append(float(reward))
    metrics = {"seats": float(len(trainable)), "idle_seats": float(sum(t.id not in acted for t in trainable))}
    if rewards:
        metrics["seat_reward_mean"] = sum(rewards) / len(rewards)
    metrics.update({f"seat_reward/{name}": sum(v) / len(v) for name, v in by_agent.items()})
    return metrics


def _agent_name(trace: Any) -> str | None:
    agent = getattr(trace, "agent", None)
    return getattr(agent, "name", None) if agent is not None else None
