"""Verifiers score responses; the pool runs them off the event loop with a timeout.

A verifier is any object with ``verify(response, reference) -> Verdict``. It
must be thread-safe and keep no per-call state on ``self``. Its class
attribute ``executor`` chooses where it runs:

* ``"thread"`` (default): daemon worker threads. A call that exceeds the
  timeout fails its episode; the stuck thread is replaced so the pool keeps
  its capacity, and it can never block interpreter exit.
* ``"process"``: worker processes, killed and restarted on timeout. Use this
  for verifiers that can hang inside C code or rely on signals (math-verify's
  signal-based timeout only works on a main thread). The verifier must be
  picklable.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import VerifierError


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one verification.

    ``reward`` is the score (1.0 / 0.0 for exact-answer tasks). ``extracted``
    is the answer as found in the response (``None`` if none was found).
    ``key`` is its canonical form, used to vote (``"18"`` for ``18.00``);
    it defaults to ``extracted``. ``reason`` says why, in a few words.
    """

    reward: float
    extracted: str | None = None
    key: str | None = None
    reason: str = ""

    @property
    def vote_key(self) -> str | None:
        return self.key if self.key is not None else self.extracted

    @property
    def correct(self) -> bool:
        return self.reward > 0

    def to_dict(self) -> dict[str, Any]:
        return {"reward": self.reward, "extracted": self.extracted, "key": self.key, "reason": self.reason}


class Verifier:
    """Base class for verifiers (subclassing is optional; the protocol is ``verify``)."""

    executor: ClassVar[str] = "thread"

    def verify(self, response: str, reference: str | None) -> Verdict:  # pragma: no cover - interface
        raise NotImplementedError


class ExactMatchVerifier(Verifier):
    """Reward 1.0 when the stripped response equals the stripped reference (optionally case-folded)."""

    def __init__(self, ignore_case: bool = False):
        self.ignore_case = ignore_case

    def verify(self, response: str, reference: str | None) -> Verdict:
        answer = response.strip()
        key = answer.casefold() if self.ignore_case else answer
        if not answer:
            return Verdict(0.0, None, None, "empty response")
        if reference is None:
            return Verdict(0.0, answer, key, "no reference")
        ref = reference.strip().casefold() if self.ignore_case else reference.strip()
        ok = key == ref
        return Verdict(1.0 if ok else 0.0, answer, key, "match" if ok else "mismatch")


# ---------------------------------------------------------------------------
# Pools
# ---------------------------------------------------------------------------


def _verify_all(verifier: Any, items: list[tuple[str, str | None]]) -> list[Verdict]:
    out = []
    for response, reference in items:
        verdict = verifier.verify(response, reference)
        if not isinstance(verdict, Verdict):
            raise TypeError(f"{type(verifier).__name__}.verify returned {type(verdict).__name__}, expected Verdict")
        out.append(verdict)
    return out


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
        if self.mode not in ("thread", "process", "inline"):
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
                result, error = _verify_all(verifier, items), None
            except BaseException as exc:  # reported on the loop, never lost
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_resolve, fut, result, error)
            except RuntimeError:  # loop closed: nobody is waiting any more
                pass

    async def verify_many(self, items: list[tuple[str, str | None]]) -> list[Verdict]:
        """Verify (response, reference) pairs; raises VerifierError on error or timeout."""
        if self._closed:
            raise VerifierError(f"verifier {self.name!r} pool is closed")
        if self.mode == "inline":
            try:
                return _verify_all(self.verifier, items)
            except Exception as exc:
                raise VerifierError(f"verifier {self.name!r} raised {type(exc).__name__}: {exc}") from exc
        if self.mode == "process":
            if self._procs is None:
                from .verifier_processes import ProcessVerifierPool

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
