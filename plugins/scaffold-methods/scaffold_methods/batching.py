"""A worker thread that runs a function on batches of items submitted from any thread or event loop.

Items arriving within ``wait_s`` of each other (up to ``max_batch``) go to
one call, so concurrent episodes (and a verifier pool's threads) share the
model's forward passes. The function runs only on the worker thread, which
therefore owns whatever it loads (a model needs no lock).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


class ThreadBatcher:
    """``submit(items)`` returns one future per item; ``fn(batch)`` returns one result per item of a batch."""

    def __init__(self, fn: Callable[[list[Any]], Sequence[Any]], *, max_batch: int = 16, wait_s: float = 0.005,
                 name: str = "scaffold-batcher"):
        if max_batch < 1 or wait_s < 0:
            raise ValueError("max_batch must be >= 1 and wait_s >= 0")
        self.fn, self.max_batch, self.wait_s, self.name = fn, max_batch, wait_s, name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.batches = 0
        self.items = 0

    def submit(self, items: Sequence[Any]) -> list[concurrent.futures.Future]:
        futures: list[concurrent.futures.Future] = []
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
                self._thread.start()
            for item in items:
                future: concurrent.futures.Future = concurrent.futures.Future()
                futures.append(future)
                self._queue.put((item, future))
        return futures

    def _main(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.wait_s
            stop = False
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._run([item for item, _ in batch], [future for _, future in batch])
            if stop:
                return

    def _run(self, items: list[Any], futures: list[concurrent.futures.Future]) -> None:
        self.batches += 1
        self.items += len(items)
        try:
            results = list(self.fn(items))
            if len(results) != len(items):
                raise RuntimeError(f"{self.name}: {len(results)} results for {len(items)} items")
        except BaseException as exc:
            for future in futures:
                future.set_exception(exc)
            return
        for future, result in zip(futures, results):
            future.set_result(result)

    def close(self, timeout: float = 60.0) -> None:
        """Finish what is queued, then stop the thread (a later ``submit`` starts a new one). Safe twice."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout)
