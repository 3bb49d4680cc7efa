"""The verifier contract: score a response against a reference answer, as a :class:`Verdict`.

A verifier is any object with ``verify(response, reference) -> Verdict``. It
must be thread-safe and keep no per-call state on ``self``. The runtime runs
it off the event loop with a timeout (``scaffold_core.run.verifier_pool``);
its class attribute ``executor`` chooses where:

* ``"thread"`` (default): daemon worker threads. A call that exceeds the
  timeout fails its episode; the stuck thread is replaced so the pool keeps
  its capacity, and it can never block interpreter exit.
* ``"process"``: worker processes, killed and restarted on timeout. Use this
  for verifiers that can hang inside C code or rely on signals (math-verify's
  signal-based timeout only works on a main thread). The verifier must be
  picklable.
* ``"inline"``: on the event loop itself; only for verifiers that are
  trivially fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

EXECUTORS = ("thread", "process", "inline")


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


def verify_all(verifier: Any, items: list[tuple[str, str | None]]) -> list[Verdict]:
    """Verify (response, reference) pairs in order; a verifier returning anything but a Verdict is a TypeError."""
    out = []
    for response, reference in items:
        verdict = verifier.verify(response, reference)
        if not isinstance(verdict, Verdict):
            raise TypeError(f"{type(verifier).__name__}.verify returned {type(verdict).__name__}, expected Verdict")
        out.append(verdict)
    return out


def __getattr__(name: str) -> Any:  # names that moved to another module stay importable from here
    from ._compat import moved_name

    return moved_name(__name__, name)
