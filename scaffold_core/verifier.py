"""The verifier contract: score a response against a reference answer, as a :class:`Verdict`.

A verifier is any object with ``verify(response, reference) -> Verdict``. It
must be thread-safe and keep no per-call state on ``self``.

The **reference** is whatever the task's ``reference(row)`` returns: any JSON
value (:data:`Reference`). By convention a string is the answer, a number a
numeric answer, a list the acceptable answers (any one of them is right), and
a dict a structured answer whose keys the task and its verifier agree on
(``{"value": 9.81, "tolerance": 0.01, "unit": "m/s^2"}``); ``None`` means the
row has none. A verifier that cannot use a reference's shape raises an error
naming it (the episode fails with that reason), never a silent zero reward.
:func:`reference_answers` turns the common shapes into a list of strings.

Rewards lie in the verifier's declared ``reward_range`` (a class attribute,
default ``(0.0, 1.0)``) and are finite; a verdict outside it fails its
episode (:class:`~scaffold_core.errors.InvalidVerdictError`), since one NaN or
out-of-range reward poisons a training batch. The runtime runs
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

import math
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from .errors import InvalidVerdictError

EXECUTORS = ("thread", "process", "inline")

#: A JSON value: what ``json.loads`` returns.
JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
#: A reference answer, as a task's ``reference(row)`` returns it and ``verify`` receives it.
Reference: TypeAlias = JSONValue
#: The rewards a verifier gives unless it declares its own ``reward_range``.
DEFAULT_REWARD_RANGE: tuple[float, float] = (0.0, 1.0)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one verification.

    ``reward`` is the score (1.0 / 0.0 for exact-answer tasks): a finite
    number within the verifier's ``reward_range``. ``extracted`` is the
    answer as found in the response (``None`` if none was found). ``key`` is
    its canonical form (``"18"`` for ``18.00``): answers with equal keys are
    the same answer, which is what ``majority_vote`` counts (:attr:`vote_key`).
    ``reason`` says why, in a few words. ``metrics`` (optional) holds the parts of the reward by name
    (a rubric's reward functions): kept with the sample in the run's store (episodes.db) and averaged over the run in
    metrics.json.

    ``scored`` is ``False`` only for a verdict made by :meth:`unscored`: the
    verifier could not score the response (a model judge whose judgement
    does not parse). Its reward is NaN; the sample is unscored, never read as
    0.0 (see ``trajectory.usable_reward``). Any other NaN reward is an error.
    """

    reward: float
    extracted: str | None = None
    key: str | None = None
    reason: str = ""
    metrics: dict[str, float] | None = None
    scored: bool = True

    @classmethod
    def unscored(cls, reason: str, extracted: str | None = None) -> Verdict:
        """A verdict that gives no reward at all (NaN, ``scored=False``): the response could not be scored."""
        return cls(math.nan, extracted, None, reason, scored=False)

    @property
    def vote_key(self) -> str | None:
        """What a vote counts: ``key``, else ``extracted``; ``None`` (no answer found) casts no vote."""
        return self.key if self.key is not None else self.extracted

    @property
    def correct(self) -> bool:
        """Whether the response is rewarded (``reward > 0``)."""
        return self.reward > 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reward": self.reward, "extracted": self.extracted, "key": self.key,
                               "reason": self.reason}
        if self.metrics:
            out["metrics"] = dict(self.metrics)
        return out


class Verifier:
    """Base class for verifiers (subclassing is optional; the protocol is ``verify``)."""

    #: Where ``verify`` runs: ``"thread"``, ``"process"`` or ``"inline"`` (see the module docstring).
    executor: ClassVar[str] = "thread"
    #: The lowest and highest reward ``verify`` gives; a reward outside it fails the episode.
    reward_range: ClassVar[tuple[float, float]] = DEFAULT_REWARD_RANGE

    def verify(self, response: str, reference: Reference) -> Verdict:  # pragma: no cover - interface
        raise NotImplementedError


def reward_range_of(verifier: Any) -> tuple[float, float]:
    """The verifier's declared ``reward_range`` (default ``(0.0, 1.0)``); raises ValueError when malformed."""
    declared = getattr(verifier, "reward_range", DEFAULT_REWARD_RANGE)
    numbers = list(declared) if isinstance(declared, (tuple, list)) else []
    if len(numbers) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
        raise ValueError(f"{type(verifier).__name__}.reward_range is {declared!r}; declare two numbers, "
                         "reward_range = (low, high)")
    low, high = float(numbers[0]), float(numbers[1])
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"{type(verifier).__name__}.reward_range is {declared!r}; it needs finite numbers "
                         "with low < high")
    return low, high


def check_verdict(verifier: Any, verdict: Any, response: str = "", reference: Reference = None) -> Verdict:
    """Return ``verdict`` if it is a :class:`Verdict` with a finite reward in the verifier's range,
    else raise :class:`InvalidVerdictError` saying what is wrong and how to fix it."""
    name = type(verifier).__name__
    if not isinstance(verdict, Verdict):
        raise InvalidVerdictError(f"{name}.verify returned {type(verdict).__name__}, expected Verdict")
    reward = verdict.reward
    if not verdict.scored and isinstance(reward, float) and math.isnan(reward):
        return verdict  # an explicit Verdict.unscored(...): the sample stays without a reward
    low, high = reward_range_of(verifier)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward) \
            or not low <= reward <= high:
        shown = repr(response) if len(repr(response)) <= 60 else repr(response)[:57] + "..."
        raise InvalidVerdictError(
            f"{name}.verify gave reward {reward!r} for response {shown} (reference {reference!r}), outside its "
            f"reward_range ({low:g}, {high:g}): a NaN or out-of-range reward poisons training. Return a finite "
            "reward within the range, or declare the range the verifier uses as a class attribute, "
            "reward_range = (low, high)")
    return verdict


def verify_all(verifier: Any, items: list[tuple[str, Reference]]) -> list[Verdict]:
    """Verify (response, reference) pairs in order; each verdict is checked by :func:`check_verdict`."""
    return [check_verdict(verifier, verifier.verify(response, reference), response, reference)
            for response, reference in items]


def reference_answers(reference: Reference) -> list[str]:
    """The acceptable answers of a reference, as strings: a string is one answer, a number its text,
    a list each of its strings and numbers; ``None`` gives ``[]``.

    Raises ValueError for shapes that are not a list of answers (a dict, a boolean, a nested list):
    a verifier that compares answers cannot use them.
    """
    if reference is None:
        return []
    items = reference if isinstance(reference, list) else [reference]
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            out.append(str(item))
        else:
            raise ValueError(
                f"reference {reference!r} is not an answer or a list of answers ({type(item).__name__} "
                "inside); this verifier compares answers: use a verifier that understands the task's "
                "structured references, or make reference(row) return a string or a list of strings")
    return out
