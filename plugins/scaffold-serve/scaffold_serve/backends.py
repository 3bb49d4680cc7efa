"""Where a session's generations run: straight on an engine (``scaffold serve``), or through an episode's runtime.

A backend takes one call's prompt ids, sampling parameters and one seed per
choice, and returns one :class:`~scaffold_core.generation.GenerationResult` per
choice, or raises :class:`~scaffold_serve.wire.WireError`.

* :class:`EngineBackend` calls ``engine.generate`` itself, each request bounded in time.
* :class:`AgentChannel` hands each call to the ``openai_agent`` controller of the episode
  the session belongs to, which yields it to scaffold's runtime as ordinary
  generation tasks (so engine timeouts, request hooks, seeds and weight versions
  are the runtime's, exactly as for any controller) and passes the results back.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.run.aio import bounded
from scaffold_core.sampling import SamplingParams, mix_seed

from .wire import WireError


def engine_failure(exc: BaseException, what: str) -> WireError:
    """A 500 (or 504 for a timeout) naming what failed, never a traceback."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return WireError(504, f"{what} timed out", type="server_error", code="timeout")
    return WireError(500, f"{what} failed: {exc}", type="server_error", code="engine_error")


def checked(result: Any, what: str) -> GenerationResult:
    try:
        result.check()
    except (ValueError, AttributeError) as exc:
        raise WireError(500, f"{what} returned a malformed result: {exc}", type="server_error",
                        code="engine_error") from exc
    if result.finish_reason == "abort":
        message = result.meta.get("message") if isinstance(result.meta, dict) else None
        raise WireError(503, f"{what} aborted the request" + (f": {message}" if message else ""),
                        type="server_error", code="engine_aborted")
    return result


class EngineBackend:
    """Generations straight on a started engine, each bounded by ``timeout`` seconds."""

    def __init__(self, engine: Any, *, timeout: float = 3600.0, name: str = "engine", seed: int | None = None):
        self.engine = engine
        self.timeout = timeout
        self.name = name
        self.seed = seed if seed is not None else secrets.randbits(62)
        self._calls = itertools.count()

    async def generate(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                       seeds: list[int | None], episode_id: str | None = None,
                       listener: Any = None) -> list[GenerationResult]:
        """``listener``: called with each output id as the engine samples it (one choice only)."""
        call = next(self._calls)  # calls without a seed of their own each get a fresh one
        requests = [GenerationRequest(f"{request_id}/{i}", prompt_ids, sampling,
                                      mix_seed(self.seed, call, i) if seed is None else seed, episode_id,
                                      listener if len(seeds) == 1 else None)
                    for i, seed in enumerate(seeds)]
        what = f"engine {self.name!r}"
        try:
            if len(requests) == 1:  # the common case: no task, no gather
                results = [await bounded(self.engine.generate(requests[0]), self.timeout)]
            else:
                results = list(await bounded(asyncio.gather(*(self.engine.generate(r) for r in requests)),
                                             self.timeout))
        except (EngineError, asyncio.TimeoutError, TimeoutError) as exc:
            raise engine_failure(exc, what) from exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise engine_failure(exc, what) from exc
        return [checked(r, what) for r in results]


@dataclass(eq=False)
class Job:
    """One call waiting for its episode's controller to generate it."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    seeds: list[int | None]
    future: asyncio.Future


class AgentChannel:
    """The calls of one agent episode, queued for its controller (created on the event loop that serves them)."""

    def __init__(self) -> None:
        self.jobs: deque[Job] = deque()
        self.wake = asyncio.Event()
        self.closed: str | None = None

    async def generate(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                       seeds: list[int | None], episode_id: str | None = None,
                       listener: Any = None) -> list[GenerationResult]:
        """``listener`` is not called: the episode's runtime returns whole generations."""
        if self.closed is not None:
            raise WireError(409, f"this session's episode is over ({self.closed}); it takes no more calls",
                            code="session_closed")
        job = Job(request_id, prompt_ids, sampling, seeds, asyncio.get_running_loop().create_future())
        self.jobs.append(job)
        self.wake.set()
        return await job.future

    async def next_jobs(self, agent: asyncio.Future) -> list[Job]:
        """The calls waiting now (after at least one arrives), or ``[]`` once the agent has finished."""
        while not self.jobs and not agent.done():
            self.wake.clear()
            waiter = asyncio.ensure_future(self.wake.wait())
            try:
                await asyncio.wait({waiter, agent}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        await asyncio.sleep(0)  # calls sent together (asyncio.gather in the agent) land together
        jobs = [job for job in self.jobs if not job.future.done()]
        self.jobs.clear()
        return jobs

    def close(self, why: str) -> None:
        """No more calls; those still waiting get a 409 naming ``why``."""
        self.closed = why
        while self.jobs:
            job = self.jobs.popleft()
            if not job.future.done():
                job.future.set_exception(WireError(409, f"this session's episode is over ({why})",
                                                   code="session_closed"))
