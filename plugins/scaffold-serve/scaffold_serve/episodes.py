"""Sessions bound to episodes: the loopback endpoint a run's agents talk to, and the loop that generates their calls.

Any controller that runs agent code against an OpenAI-compatible client uses these two
pieces (the ``openai_agent`` controller, scaffold-verifiers' ``verifiers_rollout``):

* :class:`AgentEndpoint`: one per run, started in the controller's ``start()``. A
  :class:`~scaffold_serve.service.ChatService` served on loopback by a background uvicorn
  server, with an API key made for the run; it has no engine of its own.
* :class:`EpisodeSessions`: one per episode (or branch). It opens the episode's session
  (the trained one: its conversations become the episode's samples) and, on demand, side
  sessions (a judge's calls: generated alike, recorded, never trained on). All of them
  hand their calls to one :class:`~scaffold_serve.backends.AgentChannel`; :meth:`EpisodeSessions.run`
  is the controller's generator that launches the agent coroutine on the runtime's event
  loop and yields every waiting call to scaffold's runtime as ordinary generation tasks
  (so engine timeouts, request hooks, seeds and weight versions are the run's, exactly
  as for any controller), until the agent returns.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Literal

from scaffold_core.episode import EpisodeContext
from scaffold_core.errors import ConstraintUnsupported
from scaffold_core.generation import AwaitTask

from .backends import AgentChannel, Job, engine_failure
from .service import ChatService, ServeOptions
from .session import Session
from .wire import WireError

#: How long starting an agent coroutine may take (it is only scheduled, never awaited, by then).
LAUNCH_TIMEOUT = 30.0


class AgentEndpoint:
    """The endpoint one run's agents talk to: its service, background server and per-run key."""

    def __init__(self, service: ChatService, server: Any, api_key: str):
        self.service = service
        self.server = server
        self.api_key = api_key

    @classmethod
    async def start(cls, options: ServeOptions, tool_format: Any) -> AgentEndpoint:
        """Serve ``options`` on a free loopback port (no session may be opened over HTTP: episodes open them)."""
        from .app import Endpoint, build_app
        from .server import BackgroundServer

        service = ChatService(options, tokenizer=None, tool_format=tool_format)
        api_key = secrets.token_urlsafe(24)
        server = await BackgroundServer(build_app(Endpoint(service, allow_open=False), api_key=api_key)).start()
        return cls(service, server, api_key)

    @property
    def url(self) -> str:
        return str(self.server.url)

    def base_url(self, session: Session) -> str:
        """The OpenAI base URL of ``session`` (what a client's ``base_url`` must be)."""
        return f"{self.url}/sessions/{session.id}/v1"

    async def close(self) -> None:
        """Close every session still open and stop the server."""
        for session_id in list(self.service.sessions):
            self.service.close_session(session_id)
        await self.server.stop()


class EpisodeSessions:
    """One episode's sessions on an :class:`AgentEndpoint` and the loop that generates their calls.

    ``session`` is the episode's own (opened at once, with the episode's reference, tokenizer and
    sampling); :meth:`side_session` opens more on the same channel. Call :meth:`close` when the
    episode ends (a ``finally``): waiting calls get a 409, the agent is cancelled if it still runs,
    and every session of the episode is closed.
    """

    def __init__(self, endpoint: AgentEndpoint, ctx: EpisodeContext, *, what: str):
        options = endpoint.service.options
        if options.context_length is None and ctx.tokenizer is not None:
            options.context_length = context_length(ctx.tokenizer)
        self.endpoint = endpoint
        self.ctx = ctx
        self.what = what
        self.channel = AgentChannel()
        self.session = endpoint.service.open_session(
            self.channel, reference=ctx.reference, tokenizer=ctx.tokenizer, sampling=ctx.sampling,
            metadata={"episode": ctx.episode_id, "sample": ctx.sample_base})
        self.side: list[Session] = []
        self.agent: asyncio.Future | None = None

    def side_session(self, purpose: str, *, sampling_from: Literal["request", "config"] = "request") -> Session:
        """Another session of this episode (its calls generated through the episode's runtime like the agent's)
        whose conversations are not the episode's samples: a judge's. ``sampling_from: request`` lets its
        client's own parameters (a judge's temperature) decide."""
        session = self.endpoint.service.open_session(
            self.channel, tokenizer=self.ctx.tokenizer, sampling=self.ctx.sampling, sampling_from=sampling_from,
            metadata={"episode": self.ctx.episode_id, "purpose": purpose})
        self.side.append(session)
        return session

    def base_url(self, session: Session | None = None) -> str:
        return self.endpoint.base_url(session or self.session)

    def run(self, make: Callable[[], Awaitable[Any]], timeout: float) -> Generator[Any, Any, asyncio.Future]:
        """``yield from`` this in a controller: run ``make()`` (the agent coroutine) on the runtime's event loop,
        generating its calls as they come, for at most ``timeout`` seconds. Returns the agent's finished future
        (its result or exception is the caller's to read)."""
        launch = AwaitTask(lambda: self._launch(make), timeout=LAUNCH_TIMEOUT, component="agent",
                           what=f"starting {self.what}")
        yield [launch]
        agent: asyncio.Future = launch.result
        self.agent = agent
        started = time.monotonic()
        while True:
            left = timeout - (time.monotonic() - started)
            wait = AwaitTask(lambda: self.channel.next_jobs(agent), timeout=max(left, 0.001), component="agent",
                             what=self.what)
            yield [wait]
            if not wait.result:
                return agent
            yield from self._generate(wait.result)

    @staticmethod
    async def _launch(make: Callable[[], Awaitable[Any]]) -> asyncio.Future:
        return asyncio.ensure_future(make())

    def _generate(self, jobs: list[Job]) -> Generator[Any, Any, None]:
        """The waiting calls, generated by the runtime as one list of tasks; results go back to the calls."""
        tasks = []
        for job in jobs:
            for i, seed in enumerate(job.seeds):
                task = self.ctx.generation_task(i, prompt_ids=job.prompt_ids, sampling=job.sampling,
                                                call=job.request_id)
                if seed is not None:
                    task.seed = seed
                tasks.append((job, task))
        try:
            yield [task for _, task in tasks]
        except ConstraintUnsupported as exc:  # the agent asked for what the engine cannot do: a 400 it may handle
            refusal = WireError(400, f"{exc}", code="constraint_unsupported")
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(refusal)
            return
        except Exception as exc:  # the engine failed: the calls get the error, and the episode fails with it
            error = engine_failure(exc, "the engine")
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
            raise
        for job in jobs:
            if not job.future.done():
                job.future.set_result([task.need_result() for owner, task in tasks if owner is job])

    def close(self, why: str = "the episode ended") -> None:
        self.channel.close(why)
        if self.agent is not None and not self.agent.done():
            self.agent.cancel()
        service = self.endpoint.service
        for session in (self.session, *self.side):
            service.close_session(session.id)


def context_length(tokenizer: Any) -> int | None:
    """The tokenizer's ``model_max_length`` when it is a real limit (tokenizers report 10**30 for none)."""
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 1 < limit < 10**8 else None
