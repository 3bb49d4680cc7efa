"""A verifier pool of worker processes with a hard, kill-based timeout.

Each worker is a spawned process talking over a pipe; the event loop waits on
the pipe's file descriptor, so no thread is parked per call. A call that
exceeds its timeout kills its worker, which is replaced before the next call.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
from typing import Any

from ..errors import VerifierError
from ..verifier import verify_all


def _worker_main(conn: Any, payload: bytes) -> None:  # runs in the child process
    verifier = pickle.loads(payload)
    while True:
        try:
            items = conn.recv()
        except EOFError:
            return
        if items is None:
            return
        try:
            conn.send(("ok", verify_all(verifier, items)))
        except Exception as exc:  # reported to the parent, which fails the episode
            conn.send(("err", f"{type(exc).__name__}: {exc}"))


class _Worker:
    def __init__(self, ctx: Any, payload: bytes, name: str):
        parent, child = ctx.Pipe(duplex=True)
        self.conn = parent
        self.proc = ctx.Process(target=_worker_main, args=(child, payload), name=name, daemon=True)
        self.proc.start()
        child.close()

    def kill(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)


class ProcessVerifierPool:
    def __init__(self, verifier: Any, *, workers: int, name: str):
        try:
            self._payload = pickle.dumps(verifier)
        except Exception as exc:
            raise VerifierError(
                f"verifier {name!r} uses executor='process' but cannot be pickled: {exc}"
            ) from exc
        self._ctx = multiprocessing.get_context("spawn")
        self._name = name
        self._size = max(1, workers)
        self._idle: asyncio.Queue[_Worker] | None = None
        self._all: list[_Worker] = []

    def _new_worker(self) -> _Worker:
        worker = _Worker(self._ctx, self._payload, f"scaffold-{self._name}-proc")
        self._all.append(worker)
        return worker

    async def verify_many(self, items: list[tuple[str, Any]], timeout: float) -> list[Any]:
        if self._idle is None:
            self._idle = asyncio.Queue()
            for _ in range(self._size):
                self._idle.put_nowait(self._new_worker())
        try:
            worker = await asyncio.wait_for(self._idle.get(), timeout)
        except asyncio.TimeoutError:
            raise VerifierError(f"verifier {self._name!r}: no worker process free within {timeout:g} s") from None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        fd = worker.conn.fileno()

        def readable() -> None:
            loop.remove_reader(fd)
            if fut.done():
                return
            try:
                fut.set_result(worker.conn.recv())
            except (EOFError, OSError) as exc:
                fut.set_exception(exc)

        healthy = False
        try:
            worker.conn.send(items)
            loop.add_reader(fd, readable)
            status, value = await asyncio.wait_for(fut, timeout)
            healthy = True
        except asyncio.TimeoutError:
            raise VerifierError(
                f"verifier {self._name!r} did not finish within {timeout:g} s (verifier.timeout); "
                "its worker process was killed"
            ) from None
        except (EOFError, OSError, BrokenPipeError) as exc:
            raise VerifierError(f"verifier {self._name!r} worker process died: {exc}") from exc
        finally:
            loop.remove_reader(fd)
            if healthy:
                self._idle.put_nowait(worker)
            else:
                worker.kill()
                self._all.remove(worker)
                self._idle.put_nowait(self._new_worker())
        if status == "err":
            raise VerifierError(f"verifier {self._name!r} raised {value}")
        return value

    def close(self) -> None:
        for worker in self._all:
            try:
                worker.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for worker in self._all:
            worker.proc.join(timeout=2)
            worker.kill()
        self._all.clear()
