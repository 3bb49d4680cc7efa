"""The units of work a controller yields, and what engines take and return.

A controller yields lists of these tasks; the runtime runs every task of a
list concurrently and resumes the controller once all have finished, with the
results written into the task objects:

* :class:`GenerationTask` goes to the engine (prompt token ids in; sampled
  token ids, logprobs, finish reason and text out).
* :class:`VerificationTask` goes to the verifier (response and reference in;
  a :class:`~scaffold_core.verifier.Verdict` out), off the event loop.
* :class:`AwaitTask` awaits a coroutine the controller needs on the runtime's
  event loop (an environment's reply from a second engine, a tool call),
  bounded by its own timeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .sampling import SamplingParams

if TYPE_CHECKING:
    from .verifier import Reference, Verdict

FINISH_REASONS = ("stop", "length", "abort")


def version_number(version: Any) -> int:
    """Integer policy version for the ``versions`` tensor (non-numeric versions map to 0)."""
    if isinstance(version, bool):
        return int(version)
    if isinstance(version, int):
        return version
    try:
        return int(str(version))
    except (TypeError, ValueError):
        return 0


@dataclass(slots=True)
class GenerationRequest:
    """What an engine receives: token ids in, never text.

    ``seed`` is already derived per request (from the base seed, episode id and
    sample index), so engines need not know about episodes to be reproducible.
    ``episode_id`` lets multi-server engines keep one episode on one server
    (prefix caching). ``on_token``, when set, is called with each output id as
    soon as it is sampled, in order, on the caller's event loop (a server
    streaming token by token); an engine that returns whole generations never
    calls it, and the result holds every id either way.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int | None = None
    episode_id: str | None = None
    on_token: Callable[[int], None] | None = None


@dataclass(slots=True)
class GenerationResult:
    """What an engine returns.

    ``output_ids`` are the sampled ids exactly as generated (a matched EOS or
    stop token included); ``logprobs`` has one entry per output id;
    ``finish_reason`` is ``stop`` (EOS, stop token or stop string), ``length``
    (max_tokens reached) or ``abort``. ``weight_version`` names the policy
    that produced the tokens when the engine knows it (the oldest one when
    several did). ``versions``, when the engine knows them, has one entry per
    output id: the weight version that sampled it (a request that a weight
    update reached mid-way reads ``[3, 3, 4, 4]``); ``None`` means every
    token is ``weight_version``'s.

    ``top_logprobs`` is set only when the request asked for it
    (``sampling.top_logprobs > 0``) and the engine supports it: one dict per
    output id, ``{token_id: logprob}`` of the most likely tokens at that
    position (the same distribution as ``logprobs``; the sampled token need not
    be among them). ``None`` means the engine gave none.
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str = ""
    weight_version: int | str | None = None
    versions: list[int] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    top_logprobs: list[dict[int, float]] | None = None

    def check(self) -> GenerationResult:
        """Raise ValueError if the result breaks the engine contract."""
        if len(self.output_ids) != len(self.logprobs):
            raise ValueError(
                f"engine returned {len(self.output_ids)} output ids but {len(self.logprobs)} logprobs"
            )
        if self.versions is not None and len(self.versions) != len(self.output_ids):
            raise ValueError(
                f"engine returned {len(self.output_ids)} output ids but {len(self.versions)} versions"
            )
        if self.top_logprobs is not None and len(self.top_logprobs) != len(self.output_ids):
            raise ValueError(
                f"engine returned {len(self.output_ids)} output ids but {len(self.top_logprobs)} top_logprobs entries"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"engine returned finish_reason {self.finish_reason!r}; expected one of {FINISH_REASONS}")
        return self

    def token_versions(self) -> list[int]:
        """One integer version per output id: ``versions`` when the engine gave them, else ``weight_version``'s."""
        if self.versions is not None:
            return [version_number(v) for v in self.versions]
        return [version_number(self.weight_version)] * len(self.output_ids)


@dataclass(slots=True, eq=False)
class GenerationTask:
    """One generation: prompt ids and sampling in; the engine's result out.

    Create them with :meth:`scaffold_core.EpisodeContext.generation_task`,
    which fills the episode's prompt and sampling parameters and a per-sample
    seed. After the runtime has run it, ``result`` holds the
    :class:`GenerationResult` and the convenience properties read from it.
    """

    prompt_ids: list[int]
    sampling: SamplingParams
    sample_index: int = 0
    seed: int | None = None
    request_id: str = ""
    result: GenerationResult | None = None
    verdict: Verdict | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def need_result(self) -> GenerationResult:
        """The engine's result; raises RuntimeError if the task has not run yet."""
        if self.result is None:
            raise RuntimeError("this GenerationTask has not run yet: yield it from the controller first")
        return self.result

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def output_ids(self) -> list[int]:
        return self.need_result().output_ids

    @property
    def logprobs(self) -> list[float]:
        return self.need_result().logprobs

    @property
    def versions(self) -> list[int] | None:
        return self.need_result().versions

    @property
    def finish_reason(self) -> str:
        return self.need_result().finish_reason

    @property
    def text(self) -> str:
        return self.need_result().text


@dataclass(slots=True, eq=False)
class VerificationTask:
    """Score ``response`` against ``reference`` with the run's verifier; sets ``verdict``."""

    response: str
    reference: Reference
    verdict: Verdict | None = None

    def need_verdict(self) -> Verdict:
        """The verifier's verdict; raises RuntimeError if the task has not run yet."""
        if self.verdict is None:
            raise RuntimeError("this VerificationTask has not run yet: yield it from the controller first")
        return self.verdict


@dataclass(slots=True, eq=False)
class AwaitTask:
    """Await ``make()`` on the runtime's event loop; its value lands in ``result``.

    For work a controller (or a multi-turn environment) needs that is neither
    a generation on the run's engine nor a verification: a reply from a second
    engine, a tool call over HTTP. ``make`` is called once, when the task runs,
    and must return an awaitable. The await is bounded by ``timeout`` seconds.
    An error (or the timeout) is raised at the controller's ``yield``; uncaught,
    it fails the episode with ``component`` as the failing part and ``what``
    naming the call. :class:`~scaffold_core.errors.EpisodeError` subclasses
    (e.g. an ``EngineError``, which is retryable) pass through unchanged.
    """

    make: Callable[[], Awaitable[Any]]
    timeout: float
    component: str = "controller"
    what: str = "awaited call"
    result: Any = None
