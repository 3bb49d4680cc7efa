"""The engine contract: token ids in; sampled ids, logprobs and a finish reason out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .generation import GenerationRequest, GenerationResult


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

    def stats(self) -> dict[str, Any]:
        """Engine-specific counters for metrics.json (batches, mean batch size, ...)."""
        return {}
