"""The ``openai_agent`` controller: any agent program written against an OpenAI client becomes scaffold episodes.

``controller: {name: openai_agent, entry: "my_pkg.agent:solve"}``. For each episode (and
each branch of ``majority_vote``/``best_of_n``) the controller opens a session on an
endpoint it serves on loopback for the run, and calls ``solve(row, client)``: an ``async``
function gets an ``openai.AsyncOpenAI``, a plain function (run in a thread) an
``openai.OpenAI``, bound to that session (``client.base_url`` and ``client.api_key`` build
any other client: LangChain's ``ChatOpenAI``, the Agents SDK's models). What ``solve``
returns is the episode's answer.

Every call the agent makes is yielded to the runtime as ordinary generation tasks (the
engine, timeouts, request hooks, seeds and weight versions are the run's), and the
session records the ids the engine produced. When the agent returns, the session's
conversations become the episode's samples (model tokens mask 1, everything else 0), all
scored alike: by the reward the agent (or a grader) posted to
``POST /sessions/{id}/reward`` (see :func:`scaffold_serve.client.set_reward`), else by the
task's verifier on the answer. No answer and no reward: the samples are unscored (the
trajectory maker's ``missing_reward`` policy applies), never 0.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
import math
import re
import time
from typing import Annotated, Any

from annotated_types import Ge

from scaffold_core.controller import Controller, samples_in_parallel
from scaffold_core.episode import EpisodeContext, Outcome, copy_data
from scaffold_core.errors import ConfigError, EpisodeError
from scaffold_core.generation import VerificationTask
from scaffold_core.plugins import Help, current_path
from scaffold_core.plugins import build_tool_format as build_format
from scaffold_core.verifier import Verdict

from .episodes import AgentEndpoint, EpisodeSessions
from .options import AgentSampling, AgentTimeout, ContextLength, MaxCalls
from .service import ServeOptions
from .session import Session

logger = logging.getLogger("scaffold_serve")

#: ``package.module:function`` or ``path/to/file.py:function`` (the function name may be dotted).
ENTRY = re.compile(r"(?:[A-Za-z_][\w.]*|[^:]+\.py):[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def load_entry(entry: str) -> Any:
    """The function ``module:name`` (or ``file.py:name``, relative to the working directory) names."""
    module_name, _, attr = entry.rpartition(":")
    try:
        target: Any = _load_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"controller.entry: cannot import {module_name!r} ({exc}); is the agent's package "
                          "installed, or its folder on PYTHONPATH?") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"controller.entry: {module_name!r} has no {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"controller.entry: {entry!r} is a {type(target).__name__}, not a function")
    return target


def _load_file(path: str) -> Any:
    import importlib.util
    import sys
    from pathlib import Path

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"controller.entry: {path!r} is not a file (paths are relative to the working directory "
                          f"{Path.cwd()})")
    name = f"scaffold_agent_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"controller.entry: cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Serving:
    """The endpoint one run's agents talk to and the agent function (shared by every episode)."""

    def __init__(self, endpoint: AgentEndpoint, solve: Any):
        self.endpoint = endpoint
        self.solve = solve
        self.warned_drift = False

    def warn_drift(self, entry: str, session: Session) -> None:
        """Once per run: the agent's client rewrote history, and what that does to the recording."""
        if self.warned_drift or not session.drift_count:
            return
        self.warned_drift = True
        drift = next(c["drift"] for c in session.calls if c.get("drift"))
        what = ("changed the tools between calls" if drift["kind"] == "tools" else
                f"resent a message the model had written as other text (message {drift['message']} of a request; "
                "agents such as smolagents' resend their steps as 'Calling tools: ...' and 'Observation: ...')")
        logger.warning(
            "openai_agent: agent %s's client rewrote history the model had written: it %s. "
            "Each such call is still a token-faithful sample (the prompt as the "
            "server tokenized it, the ids the model sampled), recorded as another sample of the same episode: one "
            "reward, one rollout in every metric and in pass@k, one advantage in training. The episodes' drift "
            "metric counts these splits (docs/serve.md, 'Clients that rewrite history'). Warned once per run.",
            entry, what)


class OpenAIAgentController(Controller):
    """Run ``solve(row, client)`` per episode with a client bound to a fresh session (see the module docstring).

    Options:

    * ``entry`` (required): ``"package.module:function"``, the agent.
    * ``samples`` (1): independent episodes per prompt, run concurrently (each its own session).
    * ``tool_format`` (``hermes``): how tools reach the model and its calls come back
      (``hermes``, ``native`` or ``{name: ..., options...}``).
    * ``timeout`` (600): seconds one agent run may take.
    * ``model_name`` (``scaffold``): the model name the endpoint serves (what ``model=`` must say).
    * ``sampling`` (``config``): ``config``: the run's ``sampling`` section decides temperature, top_p,
      top_k and seeds (a client's ``max_tokens`` can only lower it); ``request``: the client's
      parameters win, as on ``scaffold serve``.
    * ``max_calls`` (256): chat calls one episode may make.
    * ``context_length`` (none: the tokenizer's ``model_max_length``): longer prompts get a 400
      ``context_length_exceeded`` the agent can handle.
    """

    shared = ("serving",)

    def __init__(self, entry: Annotated[str, Help("the agent: 'package.module:function' or 'path/agent.py:function'")],
                 samples: Annotated[int, Ge(1), Help("episodes per prompt")] = 1,
                 tool_format: str | dict[str, Any] = "hermes", timeout: AgentTimeout = 600.0,
                 model_name: str = "scaffold", sampling: AgentSampling = "config", max_calls: MaxCalls = 256,
                 context_length: ContextLength | None = None):
        if not isinstance(entry, str) or not ENTRY.fullmatch(entry):
            raise ValueError(f"entry must be 'package.module:function' or 'path/to/agent.py:function', got {entry!r}")
        self.entry = entry
        self.samples = samples
        self.format = build_format(tool_format, f"{current_path('controller')}.tool_format")
        self.timeout = float(timeout)
        self.model_name = model_name
        self.sampling = sampling
        self.max_calls = max_calls
        self.context_length = context_length
        self.serving: Serving | None = None

    # -- the run's endpoint ---------------------------------------------------------------------
    async def start(self) -> None:
        """Import the agent and serve the endpoint on loopback, with a key made for this run."""
        if self.serving is not None:
            return
        try:
            import openai  # noqa: F401  (the client every agent gets)
        except ImportError as exc:
            raise ConfigError("the openai_agent controller needs the openai package: pip install openai") from exc
        solve = load_entry(self.entry)
        options = ServeOptions(model_name=self.model_name, sampling_from=self.sampling, max_calls=self.max_calls,
                               context_length=self.context_length)
        self.serving = Serving(await AgentEndpoint.start(options, self.format), solve)

    async def close(self) -> None:
        serving, self.serving = self.serving, None
        if serving is not None:
            await serving.endpoint.close()

    # -- episodes ---------------------------------------------------------------------------------
    def process(self, ctx: EpisodeContext):
        if self.samples > 1:
            return (yield from samples_in_parallel(self, ctx))
        serving = self.serving
        if serving is None:
            raise EpisodeError("the openai_agent controller was not started (its endpoint is not serving)",
                               component="controller")
        episode = EpisodeSessions(serving.endpoint, ctx, what=f"agent {self.entry}")
        started = time.monotonic()
        try:
            row = copy_data(ctx.row)
            agent = yield from episode.run(functools.partial(self._solve, serving, episode, row), self.timeout)
            answer = self._answer(agent, episode.session)
            verdict = yield from self._score(episode.session, answer, ctx)
        finally:
            episode.close()
        return self._outcome(episode.session, answer, verdict, ctx, time.monotonic() - started)

    async def _solve(self, serving: Serving, episode: EpisodeSessions, row: dict[str, Any]) -> Any:
        import openai

        base_url, api_key = episode.base_url(), serving.endpoint.api_key
        if inspect.iscoroutinefunction(serving.solve):
            client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=self.timeout)
            async with client:
                return await serving.solve(row, client)
        sync_client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=self.timeout)
        with sync_client:
            return await asyncio.to_thread(serving.solve, row, sync_client)

    def _answer(self, agent: asyncio.Future, session: Session) -> str | None:
        if agent.cancelled():
            raise EpisodeError(f"agent {self.entry} was cancelled", component="agent")
        error = agent.exception()
        if error is not None:
            raise EpisodeError(f"agent {self.entry} raised {type(error).__name__}: {error}",
                               component="agent") from error
        answer = agent.result()
        if not session.trajectories:
            raise EpisodeError(f"agent {self.entry} returned without a chat completion call through its client: "
                               "there is nothing to train on (call client.chat.completions.create, or build the "
                               "agent's model client from client.base_url and client.api_key)", component="agent")
        if answer is None:
            return session.answer
        return answer if isinstance(answer, str) else str(answer)

    def _score(self, session: Session, answer: str | None, ctx: EpisodeContext):
        if session.reward is not None:
            return Verdict(session.reward, answer, None, "reward posted to the session")
        if answer is None:
            return Verdict(math.nan, None, None, "the agent returned no answer and no reward was posted")
        check = VerificationTask(answer, ctx.reference)
        yield [check]
        return check.need_verdict()

    def _outcome(self, session: Session, answer: str | None, verdict: Verdict, ctx: EpisodeContext,
                 seconds: float) -> Outcome:
        meta = {"session": session.id, "agent": self.entry, "calls": session.counts["calls"]}
        if self.serving is not None:
            self.serving.warn_drift(self.entry, session)
        # every conversation of the session is a piece of one agent run: one rollout (the branch's own number)
        samples = [t.sample(answer or "", verdict, ctx.sample_base + k, meta, rollout=ctx.sample_base)
                   for k, t in enumerate(session.trajectories)]
        metrics = {"agent_calls": float(session.counts["calls"]), "agent_trajectories": float(len(samples)),
                   "drift": float(session.drift_count), "forks": float(session.counts["fork"]),
                   "answered": float(answer is not None), "agent_s": seconds}
        return Outcome(samples=samples, chosen=session.last_trajectory, answer=answer,
                       answer_reward=None if math.isnan(verdict.reward) else verdict.reward, metrics=metrics,
                       prompt=session.trajectories[0].start.text)

