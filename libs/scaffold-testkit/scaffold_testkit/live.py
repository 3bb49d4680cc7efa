"""Drive async engines from synchronous test code: an event loop on a thread, and a started engine on it.

Engines keep loop-bound state (queues, futures, batcher tasks) from ``start()``
on, so an engine that is shared between tests (one model load per session)
must live on one loop for its whole life. :class:`BackgroundLoop` is that
loop, on a daemon thread; :class:`LiveEngine` is an engine started on it.
Every call waits with a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
from collections.abc import Awaitable, Sequence
from typing import Any

from scaffold_core.engine import Engine
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import render_chat


class BackgroundLoop:
    """An asyncio event loop running on a daemon thread until :meth:`close`."""

    def __init__(self, name: str = "scaffold-test-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, awaitable: Awaitable[Any], timeout: float) -> Any:
        """Run ``awaitable`` on the loop and return its result; raise TimeoutError after ``timeout`` s."""
        if self.loop.is_closed():
            raise RuntimeError("this BackgroundLoop is closed")

        async def wrapped() -> Any:
            return await awaitable

        future = asyncio.run_coroutine_threadsafe(wrapped(), self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"did not finish within {timeout:g} s") from None

    def close(self, timeout: float = 30.0) -> None:
        """Cancel what is still running, stop the loop and join its thread. Safe to call twice."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            try:
                self.run(cancel_all(), timeout)
            except TimeoutError:
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


class LoopLagMonitor:
    """Measures how long the running event loop goes without running other work.

    Use it on the loop under test (``async with LoopLagMonitor() as lag: ...``):
    a heartbeat coroutine sleeps ``interval`` seconds at a time, and
    :attr:`max_block` is the longest it was held up beyond that, i.e. the
    longest time something on the loop ran without yielding (a blocking call
    inside a coroutine, CPU work in a controller's ``process``).

    With ``quiet_gc`` (default) the process's objects are collected and frozen
    before the heartbeat starts and the collector is off while it runs, so a
    garbage collection of a large heap (a loaded model) is not mistaken for
    the code under test blocking the loop.
    """

    def __init__(self, interval: float = 0.005, *, quiet_gc: bool = True) -> None:
        self.interval = interval
        self.quiet_gc = quiet_gc
        self.max_block = 0.0
        self._task: asyncio.Task | None = None
        self._gc_was_enabled = False

    async def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(self.interval)
            now = loop.time()
            self.max_block = max(self.max_block, now - last - self.interval)
            last = now

    async def __aenter__(self) -> LoopLagMonitor:
        if self.quiet_gc:
            self._gc_was_enabled = gc.isenabled()
            gc.collect()
            gc.freeze()  # what lives now is never scanned again while monitoring
            gc.disable()
        self._task = asyncio.ensure_future(self._beat())
        await asyncio.sleep(0)  # let the heartbeat take its first time stamp
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._task is not None:
            await asyncio.sleep(0)  # a block that ended just now is still measured
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.quiet_gc:
            gc.unfreeze()
            if self._gc_was_enabled:
                gc.enable()


class LiveEngine:
    """An engine started on a :class:`BackgroundLoop`, callable from synchronous code.

    ``LiveEngine.start(engine)`` starts it (bounded by ``start_timeout``);
    :meth:`generate` and :meth:`generate_many` send requests and wait at most
    ``timeout`` seconds; :meth:`close` closes the engine and stops the loop.
    """

    def __init__(self, engine: Engine, loop: BackgroundLoop, *, timeout: float = 120.0) -> None:
        self.engine = engine
        self.loop = loop
        self.timeout = timeout
        self._counter = 0
        self._lock = threading.Lock()

    @classmethod
    def start(cls, engine: Engine, *, start_timeout: float = 600.0, timeout: float = 120.0) -> LiveEngine:
        loop = BackgroundLoop()
        try:
            loop.run(engine.start(), start_timeout)
        except BaseException:
            try:
                loop.run(engine.close(), 30.0)
            finally:
                loop.close()
            raise
        return cls(engine, loop, timeout=timeout)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def prompt_ids(self, prompt: str | Sequence[dict[str, Any]]) -> list[int]:
        """Token ids of a chat prompt (a user message, or a list of messages) in the engine's template."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return render_chat(self.tokenizer, messages)[1]

    def request(self, prompt: str | Sequence[dict[str, Any]] | list[int], sampling: SamplingParams,
                seed: int | None = None) -> GenerationRequest:
        """A request for ``prompt`` (text, messages or token ids) with a fresh request id."""
        with self._lock:
            self._counter += 1
            n = self._counter
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        else:
            ids = self.prompt_ids(prompt)  # type: ignore[arg-type]
        return GenerationRequest(request_id=f"test-{n}", prompt_ids=ids, sampling=sampling,
                                 seed=seed if seed is not None else sampling.seed, episode_id=f"test-{n}")

    def generate(self, request: GenerationRequest, *, timeout: float | None = None) -> GenerationResult:
        return self.loop.run(self.engine.generate(request), timeout or self.timeout)

    def generate_many(self, requests: Sequence[GenerationRequest], *,
                      timeout: float | None = None) -> list[GenerationResult]:
        """Send every request at once (so a batching engine may batch them); results in request order."""

        async def all_of() -> list[GenerationResult]:
            return list(await asyncio.gather(*(self.engine.generate(r) for r in requests)))

        return self.loop.run(all_of(), timeout or self.timeout)

    def run(self, awaitable: Awaitable[Any], *, timeout: float | None = None) -> Any:
        """Run any coroutine on the engine's loop (e.g. a :class:`~scaffold_core.Runtime`)."""
        return self.loop.run(awaitable, timeout or self.timeout)

    def close(self, timeout: float = 60.0) -> None:
        """Close the engine, then the loop. Safe to call twice."""
        if not self.loop.loop.is_closed():
            try:
                self.loop.run(self.engine.close(), timeout)
            finally:
                self.loop.close()
