"""Run a verifier off the event loop, every call bounded by a timeout: in threads, processes or inline.

The verifier's ``executor`` attribute (see :mod:`scaffold_core.verifier`)
chooses the mode. A thread call that exceeds the timeout fails its episode
and the stuck thread is replaced; a process call that exceeds it kills its
worker process (``scaffold_core.run.verifier_processes``).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

from ..errors import VerifierError
from ..verifier import EXECUTORS, Reference, Verdict, verify_all
from .verifier_processes import ProcessVerifierPool


class VerifierPool:
    """Runs a verifier off the event loop; every call is bounded by ``timeout`` seconds."""

    #: How many stuck threads may be replaced before the pool gives up.
    MAX_REPLACEMENTS = 32

    def __init__(self, verifier: Any, *, timeout: float = 30.0, workers: int = 2, name: str = "verifier"):
        self.verifier = verifier
        self.timeout = timeout
        self.name = name
        self.workers = max(1, workers)
        self.mode = getattr(verifier, "executor", "thread")
        if self.mode not in EXECUTORS:
            raise ValueError(f"verifier {name!r}: executor must be 'thread', 'process' or 'inline', got {self.mode!r}")
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._replaced = 0
        self._procs: Any = None
        self._closed = False

    # -- threads ---------------------------------------------------------
    def _spawn_thread(self) -> None:
        t = threading.Thread(target=self._thread_main, name=f"scaffold-{self.name}-{len(self._threads)}", daemon=True)
        t.start()
        self._threads.append(t)

    def _thread_main(self) -> None:
        verifier = self.verifier
        while True:
            job = self._queue.get()
            if job is None:
                return
            loop, fut, items = job
            try:
                result, error = verify_all(verifier, items), None
            except BaseException as exc:  # reported on the loop, never lost
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_resolve, fut, result, error)
            except RuntimeError:  # loop closed: nobody is waiting any more
                pass

    async def verify_many(self, items: list[tuple[str, Reference]]) -> list[Verdict]:
        """Verify (response, reference) pairs; raises VerifierError on error or timeout."""
        if self._closed:
            raise VerifierError(f"verifier {self.name!r} pool is closed")
        if self.mode == "inline":
            try:
                return verify_all(self.verifier, items)
            except Exception as exc:
                raise VerifierError(f"verifier {self.name!r} raised {type(exc).__name__}: {exc}") from exc
        if self.mode == "process":
            if self._procs is None:
                self._procs = ProcessVerifierPool(self.verifier, workers=self.workers, name=self.name)
            return await self._procs.verify_many(items, self.timeout)
        if not self._threads:
            for _ in range(self.workers):
                self._spawn_thread()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put((loop, fut, items))
        try:
            return await asyncio.wait_for(fut, self.timeout)
        except asyncio.TimeoutError:
            self._replace_stuck_thread()
            raise VerifierError(
                f"verifier {self.name!r} did not finish within {self.timeout:g} s "
                f"(verifier.timeout); the episode is failed, the stuck call is abandoned"
            ) from None
        except VerifierError:
            raise
        except Exception as exc:
            raise VerifierError(f"verifier {self.name!r} raised {type(exc).__name__}: {exc}") from exc

    def _replace_stuck_thread(self) -> None:
        if self._replaced >= self.MAX_REPLACEMENTS:
            return
        self._replaced += 1
        self._spawn_thread()

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        if self._procs is not None:
            self._procs.close()


def _resolve(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
