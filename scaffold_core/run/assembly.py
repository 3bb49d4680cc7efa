"""The runtime's assembly, the one way ``scaffold run`` and trainers put it together.

* :class:`Components`: the task, controller, engine, verifier and trajectory
  maker of a run, built once from a config (:meth:`Components.from_config`)
  or handed over as objects.
* :class:`Limits`: how many episodes run at once (``None``: as many as the
  caller starts, a trainer that bounds them itself) and how long anything may
  wait, in one frozen record checked once.
* :func:`started`: one async context manager that starts the engine (when
  the caller manages it), then the controller, then the verifier pool, and
  closes them in reverse order, also when a start fails half-way.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..controller import close_controller, start_controller
from ..engine import RunInfo
from .verifier_pool import VerifierPool


@dataclass
class Components:
    """What a run is made of: ``task``, ``controller``, ``engine``, and optionally ``verifier`` and
    ``trajectory_maker``."""

    task: Any
    controller: Any
    engine: Any
    verifier: Any = None
    trajectory_maker: Any = None

    @classmethod
    def from_config(cls, config: Any, registry: Any, *, engine: Any = None) -> Components:
        """Construct every component a config names (cheap: nothing loads until the engine starts); ``engine``
        replaces the configured one."""

        def make(section: str, kind: str) -> Any:
            comp = getattr(config, section)
            return registry.create(kind, comp.name, comp.options, path=section)

        return cls(
            task=make("task", "task"),
            controller=make("controller", "controller"),
            verifier=make("verifier", "verifier"),
            engine=engine if engine is not None else make("engine", "engine"),
            trajectory_maker=make("trajectory", "trajectory_maker"),
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """How much runs at once and how long each wait may last (the ``rollout`` and ``verifier`` sections' bounds).

    ``concurrency``: episodes in flight (``None``: unbounded, for a caller
    that bounds them itself, as AReaL and verl do); ``request_timeout``,
    ``episode_timeout`` and ``verifier_timeout``: seconds; ``retries``: extra
    attempts of an episode whose error is retryable; ``verifier_workers``:
    the verifier pool's threads or processes.
    """

    concurrency: int | None = 64
    request_timeout: float = 3600.0
    episode_timeout: float = 7200.0
    retries: int = 0
    verifier_timeout: float = 30.0
    verifier_workers: int = 2

    def __post_init__(self) -> None:
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int)
                                             or self.concurrency < 1):
            raise ValueError(f"concurrency must be an integer >= 1 or None (unbounded), got {self.concurrency!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {self.retries!r}")
        for name in ("request_timeout", "episode_timeout", "verifier_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")

    @classmethod
    def from_config(cls, config: Any) -> Limits:
        """The limits a resolved :class:`~scaffold_core.config.Config` sets."""
        r = config.rollout
        return cls(concurrency=r.concurrency, request_timeout=r.request_timeout, episode_timeout=r.episode_timeout,
                   retries=r.retries, verifier_timeout=config.verifier_timeout,
                   verifier_workers=config.verifier_workers)


#: The limits of a config that sets none (frozen, so one object serves every default).
DEFAULT_LIMITS = Limits()


@contextlib.asynccontextmanager
async def started(components: Components, limits: Limits, *, manage_engine: bool = True,
                  run_info: RunInfo | None = None, verifier_name: str | None = None
                  ) -> AsyncIterator[VerifierPool | None]:
    """Start the engine (``manage_engine``: after attaching ``run_info``), the controller, then the verifier pool
    (yielded; ``None`` without a verifier); on the way out close them in reverse order. What a start that fails
    half-way had started, it still closes: the engine and controller from the moment their start is called."""
    async with contextlib.AsyncExitStack() as stack:
        engine = components.engine
        if manage_engine:
            if run_info is not None and hasattr(engine, "attach_run"):
                engine.attach_run(run_info)  # where an engine that starts servers logs, and its ports
            stack.push_async_callback(engine.close)
            await engine.start()
        stack.push_async_callback(close_controller, components.controller)
        await start_controller(components.controller)
        pool = None
        if components.verifier is not None:
            pool = VerifierPool(components.verifier, timeout=limits.verifier_timeout, workers=limits.verifier_workers,
                                name=verifier_name or type(components.verifier).__name__)
            stack.callback(pool.close)
        yield pool
