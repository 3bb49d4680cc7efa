"""One asyncio event loop on a daemon thread for a whole training run.

TRL calls ``rollout_func`` synchronously on its own thread. The engine's
batcher and queue belong to one event loop, so a fresh ``asyncio.run`` per
step would break them: every coroutine of the run goes to this loop instead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop on its own thread; :meth:`run` waits (bounded) for a coroutine submitted to it."""

    def __init__(self, name: str = "scaffold-trl-loop"):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and return its result; cancel it and raise TimeoutError after ``timeout`` s."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"did not finish within {timeout:g} s") from None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the loop, join the thread and close the loop (safe twice)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        if not self.thread.is_alive():
            self.loop.close()
