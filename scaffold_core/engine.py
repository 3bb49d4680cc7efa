"""The engine contract: token ids in; sampled ids, logprobs and a finish reason out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConstraintUnsupported, EngineError
from .generation import GenerationRequest, GenerationResult
from .sampling import SamplingParams


@dataclass(frozen=True)
class RunInfo:
    """Where and as which worker an engine runs; given to ``Engine.attach_run`` before ``start()``.

    ``output_dir``: the run's output directory (engines write server logs
    there). ``port_range``: the inclusive port slice this worker owns (see
    :mod:`scaffold_core.distributed.ports`); engines that start servers take ports from it.
    """

    output_dir: Path | None = None
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    port_range: tuple[int, int] | None = None


class Engine:
    """Base class of inference engines.

    Lifecycle: construct (cheap: validates options, loads nothing), ``await
    start()`` (loads the model or connects), any number of concurrent ``await
    generate(request)`` calls, then ``await close()`` (frees everything it
    started: threads, processes, servers, sessions).

    ``tokenizer`` must be available after ``start()``: tasks render prompts
    with its chat template. ``context_length`` (if known) lets the runtime
    fail over-long prompts with a clear reason.
    """

    tokenizer: Any = None
    context_length: int | None = None
    run_info: RunInfo | None = None
    #: The version of the weights new requests are generated with: 0 at start, changed only by
    #: :meth:`update_weights`. Each result reports the version(s) that produced it.
    weight_version: int = 0
    #: The :class:`~scaffold_core.sampling.Constraint` kinds this engine enforces (grammar-constrained decoding);
    #: a request with any other constraint is refused before it reaches the engine (:func:`check_constraint`).
    constraints: frozenset[str] = frozenset()
    #: Tokens decoded so far, counted as they are sampled (None: the engine keeps no live count). The run's
    #: progress shows it while a batch decodes, before any request returns.
    decoded_tokens: int | None = None

    def attach_run(self, info: RunInfo) -> None:
        """Called by the rollout before ``start()``: output dir, rank and this worker's port slice."""
        self.run_info = info

    async def start(self) -> None:
        """Load or connect. Called once before the first request."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:  # pragma: no cover
        """Generate for one request. Must honour every field of ``request.sampling``."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release everything ``start()`` acquired. Safe to call twice."""

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def update_weights(self, source: Any = None, *, version: int | None = None) -> int:
        """Serve new policy weights; return the new :attr:`weight_version`.

        ``source`` says where the weights come from; what an engine accepts is
        its own (the embedded engine: a state dict, a checkpoint directory, or
        ``None`` when the caller changed the weights of the model object it
        lent the engine; SGLang: a checkpoint directory). ``version`` sets the
        new version (it may not go backwards); by default it is the current
        one plus 1.

        In-flight requests: every request that starts after the call returns
        runs on the new weights and reports the new version. A request
        already generating either finishes on the old weights or goes on on
        the new ones (the embedded engine does this, between two decode
        steps); either way its result says which version sampled each token
        (``GenerationResult.versions``, or ``weight_version`` when one did).
        Raises :class:`~scaffold_core.errors.EngineError` when the engine
        cannot load the weights (it then keeps serving the old ones and the
        old version).
        """
        raise EngineError(f"the {type(self).__name__} engine cannot update its weights", retryable=False)

    def next_weight_version(self, version: int | None) -> int:
        """The version an update moves to: ``version`` (never below the current one) or current + 1."""
        if version is None:
            return self.weight_version + 1
        if isinstance(version, bool) or not isinstance(version, int):
            raise EngineError(f"weight version must be an integer, got {version!r}", retryable=False)
        if version < self.weight_version:
            raise EngineError(f"weight version {version} is older than the engine's current version "
                              f"{self.weight_version}; versions never go backwards", retryable=False)
        return version

    def stats(self) -> dict[str, Any]:
        """Engine-specific counters for metrics.json (batches, mean batch size, ...)."""
        return {}


def check_constraint(engine: Any, sampling: SamplingParams, name: str = "") -> None:
    """Raise :class:`~scaffold_core.errors.ConstraintUnsupported` when ``sampling`` has a constraint ``engine``
    does not enforce (an engine that ignored it would sample unconstrained output as if it were constrained)."""
    constraint = sampling.constraint
    if constraint is None or constraint.kind in getattr(engine, "constraints", frozenset()):
        return
    label = name or type(engine).__name__
    why = f" (asked for by {constraint.reason})" if constraint.reason else ""
    kinds = ", ".join(sorted(getattr(engine, "constraints", ()))) or "none"
    raise ConstraintUnsupported(
        f"engine {label!r} cannot constrain decoding to a {constraint.kind} grammar{why}; it enforces: {kinds}. "
        "Use the transformers engine (with xgrammar installed) or sglang, or leave the constraint out")
