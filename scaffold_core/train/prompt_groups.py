"""Rollouts for trainers: run one prompt group through any controller on an engine, get training samples.

This is the one shape every trainer adapter uses (TRL, AReaL, verl, or your
own)::

    rollouts = TrainingRollouts.from_config(config, engine=engine)   # or TrainingRollouts(components, ...)
    async with rollouts:                                             # starts engine, controller, verifier
        group = await rollouts.run_group(row, samples=8)              # one prompt, 8 samples
        group.samples    # [TrainingSample]: tokens exactly as sampled, behaviour logprobs, per-token versions

A group is every sample of one task row: the controller's episode, run as
many times as needed to reach ``samples`` rollouts (a ``native`` controller
with ``samples: 1`` runs 8 episodes; ``best_of_n`` with ``samples: 4`` runs
2). A rollout is one sample, or every sample of one agent run whose client
rewrote its history (``Sample.rollout``): those are kept together, so a
group may hold more samples than ``samples``.
Each episode gets its own id and seed, and a row's seeds change from one call
to the next, so a trainer that sees a prompt again gets fresh samples. Every
sample's ``group_id`` names its group. A call may bring its own sampling
parameters (``run_group(row, sampling=...)``: a trainer that sets them per
request, as verl does) and its own ``group_id`` (ids unique beyond this
process, for servers that key requests by id).

Staleness (a :class:`~scaffold_core.train.staleness.StalenessPolicy`): when
a group is handed over, a sample whose oldest generated token is more than
``max_staleness`` weight versions behind the engine's current
:attr:`~scaffold_core.engine.Engine.weight_version` is stale; ``on_stale:
drop`` removes it, ``on_stale: regenerate`` runs the whole group again on the
current weights (up to ``max_regenerations`` times, then drops what is still
stale). Both are counted in :class:`RolloutStats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..episode import EpisodeContext, EpisodeResult
from ..run.assembly import DEFAULT_LIMITS, Components, Limits, started
from ..sampling import SamplingParams, derive_seed
from ..spans import clock
from ..task import episode_context, episode_id_of
from ..trajectory import TrainingSample
from .staleness import KEEP_ALL, StalenessPolicy


@dataclass
class RolloutGroup:
    """The samples of one prompt, ready for a trainer.

    ``samples``: the training samples, in episode order (at most the number
    asked for). ``episodes``: every episode that ran for the group, failed
    ones included (``failed`` lists those, with their ``error``).
    ``stale_dropped``: samples dropped as stale; ``regenerations``: times the
    group was run again because a sample was stale.
    """

    group_id: str
    index: int
    row: dict[str, Any]
    samples: list[TrainingSample] = field(default_factory=list)
    episodes: list[EpisodeResult] = field(default_factory=list)
    stale_dropped: int = 0
    regenerations: int = 0

    @property
    def failed(self) -> list[EpisodeResult]:
        return [e for e in self.episodes if not e.ok]

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids (every sample of the group shares them)."""
        return self.samples[0].input_ids[: self.samples[0].prompt_len] if self.samples else []


@dataclass
class RolloutStats:
    """Counters over every group a :class:`TrainingRollouts` ran (``to_dict()`` for metrics)."""

    groups: int = 0
    episodes: int = 0
    failed_episodes: int = 0
    samples: int = 0
    generated_tokens: int = 0
    stale_dropped: int = 0
    stale_regenerated: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class TrainingRollouts:
    """Runs prompt groups through a controller on an engine and returns :class:`TrainingSample` lists.

    Built from :class:`~scaffold_core.run.assembly.Components` (``task``,
    ``controller``, ``engine``, optional ``verifier`` and ``trajectory_maker``,
    by default ``single_turn``) with the ``sampling`` parameters, the
    :class:`~scaffold_core.run.assembly.Limits` every wait is bounded by (as
    ``scaffold run``'s; failed episodes are retried ``limits.retries`` times
    and reported in :attr:`RolloutGroup.episodes`) and a
    :class:`~scaffold_core.train.staleness.StalenessPolicy`; or with
    :meth:`from_config`. Use it as an async context manager, or call
    :meth:`start` and :meth:`close`; with ``manage_engine=False`` the
    engine's lifecycle stays the caller's; ``run_info`` (a
    :class:`~scaffold_core.engine.RunInfo`) is attached to a managed engine
    before it starts.
    """

    def __init__(self, components: Components, *, sampling: SamplingParams, limits: Limits = DEFAULT_LIMITS,
                 staleness: StalenessPolicy = KEEP_ALL, engine_name: str = "engine",
                 manage_engine: bool = True, hooks: Any = None, run_info: Any = None, record_spans: bool = True):
        if components.trajectory_maker is None:
            from ..builtins.trajectories import SingleTurnTrajectoryMaker

            components = dataclasses.replace(components, trajectory_maker=SingleTurnTrajectoryMaker())
        self.components = components
        self.sampling = sampling
        self.limits = limits
        self.staleness = staleness
        self.engine_name = engine_name
        self.manage_engine = manage_engine
        self.hooks = hooks
        self.run_info = run_info
        self.record_spans = record_spans
        self.stats = RolloutStats()
        self._calls = itertools.count()
        self._runtime: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._slots: asyncio.Semaphore | None = None
        self._starting: asyncio.Lock | None = None

    @classmethod
    def from_config(cls, config: Any, *, engine: Any = None, registry: Any = None, **options: Any) -> TrainingRollouts:
        """Build from a resolved :class:`~scaffold_core.config.Config`: its task, controller, verifier,
        trajectory maker, sampling, the ``rollout`` limits and staleness policy, and its engine unless
        ``engine`` is given. ``options`` are the constructor's other keyword arguments (and override these)."""
        from ..plugins import get_registry

        kwargs: dict[str, Any] = dict(
            sampling=config.sampling.params(), limits=Limits.from_config(config),
            staleness=StalenessPolicy.from_config(config), engine_name=config.engine.name,
            record_spans=config.output.spans)
        kwargs.update(options)
        return cls(Components.from_config(config, registry or get_registry(), engine=engine), **kwargs)

    # -- lifecycle ----------------------------------------------------------
    async def start(self) -> None:
        """Start the engine (when managed), the controller and the verifier pool.

        Once: later calls return at once, and concurrent first calls (a
        trainer's first episodes, all starting together) wait for one start.
        """
        if self._runtime is not None:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._runtime is None:
                await self._start()

    async def _start(self) -> None:
        from ..run.runtime import Runtime

        comps = self.components
        stack = contextlib.AsyncExitStack()
        try:
            pool = await stack.enter_async_context(started(comps, self.limits, manage_engine=self.manage_engine,
                                                           run_info=self.run_info))
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        concurrency = self.limits.concurrency
        self._slots = asyncio.Semaphore(concurrency) if concurrency is not None else None
        self._runtime = Runtime(engine=comps.engine, controller=comps.controller, verifier=pool,
                                trajectory_maker=comps.trajectory_maker, hooks=self.hooks,
                                engine_name=self.engine_name, limits=self.limits, record_spans=self.record_spans)

    async def close(self) -> None:
        """Release what :meth:`start` acquired, in reverse order (safe twice; the engine only when managed)."""
        self._runtime = None
        self._starting = None  # a later start may run on another event loop
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> TrainingRollouts:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- rows -----------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """The task's rows (``task.load()``), in order."""
        return list(self.components.task.load())

    @property
    def weight_version(self) -> int:
        """The engine's current weight version (0 for engines that do not track one)."""
        version = getattr(self.components.engine, "weight_version", 0)
        return version if isinstance(version, int) and not isinstance(version, bool) else 0

    # -- groups ---------------------------------------------------------------
    async def run_groups(self, rows: Iterable[dict[str, Any]], *, samples: int | None = None,
                         start_index: int = 0, sampling: SamplingParams | None = None) -> list[RolloutGroup]:
        """:meth:`run_group` for each row, concurrently; groups come back in row order."""
        coros = [self.run_group(row, samples=samples, index=start_index + i, sampling=sampling)
                 for i, row in enumerate(rows)]
        return list(await asyncio.gather(*coros))

    async def run_group(self, row: dict[str, Any], *, samples: int | None = None, index: int = 0,
                        sampling: SamplingParams | None = None, group_id: str | None = None,
                        task: Any = None) -> RolloutGroup:
        """Run ``row`` through the controller until the group holds ``samples`` training samples.

        ``samples=None`` runs one episode and keeps whatever it produces.
        Fewer samples come back only when episodes fail (see
        ``group.failed``) or stale samples are dropped. ``sampling``: this
        call's sampling parameters (default: the rollouts' ``sampling``); the
        controller sees them as ``ctx.sampling`` and episode seeds derive
        from their ``seed``. ``group_id``: the group's id, which prefixes
        every episode id (``<group_id>/<n>``); by default ``<row id>@<call
        number>``, which repeats across runs so that seeds do. ``task``: the
        task that renders this row's prompt and reference (default: the
        rollouts' own; e.g. the same task over a held-out split).
        """
        if self._runtime is None:
            raise RuntimeError("TrainingRollouts is not started: use `async with rollouts:` or await start()")
        if samples is not None and samples < 1:
            raise ValueError(f"samples must be >= 1 or None, got {samples}")
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ValueError(f"group_id must be a non-empty string, got {group_id!r}")
        call = next(self._calls)
        group = RolloutGroup(group_id=group_id or f"{episode_id_of(row, index)}@{call}", index=index, row=row)
        sampling = sampling or self.sampling
        attempt = 0
        while True:
            group.samples = await self._fill(group, samples, attempt, sampling, task or self.components.task)
            stale = [s for s in group.samples if self.staleness.is_stale(s, self.weight_version)]
            if not stale:
                break
            if self.staleness.on_stale == "regenerate" and attempt < self.staleness.max_regenerations:
                attempt += 1
                group.regenerations += 1
                self.stats.stale_regenerated += 1
                continue
            group.samples = [s for s in group.samples if not any(s is x for x in stale)]
            group.stale_dropped += len(stale)
            self.stats.stale_dropped += len(stale)
            break
        self.stats.groups += 1
        self.stats.samples += len(group.samples)
        self.stats.generated_tokens += sum(sum(s.loss_mask) for s in group.samples)
        return group

    async def _fill(self, group: RolloutGroup, samples: int | None, attempt: int,
                    sampling: SamplingParams, task: Any) -> list[TrainingSample]:
        """Run waves of episodes until ``samples`` samples are in hand (or a wave yields nothing)."""
        per_episode = getattr(self.components.controller, "samples", 1)
        per_episode = per_episode if isinstance(per_episode, int) and per_episode >= 1 else 1
        out: list[TrainingSample] = []
        try:
            ctx = episode_context(task, group.index, group.row, self.components.engine.tokenizer, sampling)
        except Exception as exc:  # an unusable row fails its group, never the trainer's process
            failed = EpisodeResult(episode_id=group.group_id, index=group.index, status="failed", row=group.row,
                                   reference=task.reference(group.row), error_component="task",
                                   error=f"building the prompt failed: {type(exc).__name__}: {exc}")
            group.episodes.append(failed)
            self.stats.episodes += 1
            self.stats.failed_episodes += 1
            return out
        serial = 0
        runs: list[Any] = []  # the rollout of each sample in ``out`` (an agent run's samples share one)
        for _wave in range(3):
            needed = 1 if samples is None else math.ceil((samples - len(out)) / per_episode)
            results = await asyncio.gather(*(self._episode(ctx, group, attempt, serial + k) for k in range(needed)))
            serial += needed
            produced = 0
            for result in results:
                group.episodes.append(result)
                self.stats.episodes += 1
                if not result.ok:
                    self.stats.failed_episodes += 1
                    continue
                run_of = {s.sample_index: (result.episode_id, s.rollout)
                          for s in result.samples if s.rollout is not None}
                for t in result.trajectories:
                    t.group_id = group.group_id
                    out.append(t)
                    runs.append(run_of.get(t.sample_index, (id(t),)))
                    produced += 1
            if samples is None or len(dict.fromkeys(runs)) >= samples or produced == 0:
                break
        if samples is None:
            return out
        kept = set(list(dict.fromkeys(runs))[:samples])  # whole rollouts: an agent run's samples stay together
        return [t for t, run in zip(out, runs) if run in kept]

    async def _episode(self, prototype: EpisodeContext, group: RolloutGroup, attempt: int,
                       serial: int) -> EpisodeResult:
        assert self._runtime is not None
        episode_id = f"{group.group_id}/{serial}" + (f"r{attempt}" if attempt else "")
        ctx = dataclasses.replace(prototype, episode_id=episode_id,
                                  seed=derive_seed(prototype.sampling.seed, episode_id), state={})
        if self._slots is None:  # unbounded: the caller bounds the episodes in flight
            return await self._runtime.run_episode(ctx)
        waiting = clock()
        async with self._slots:
            return await self._runtime.run_episode(ctx, queued_since=waiting)
