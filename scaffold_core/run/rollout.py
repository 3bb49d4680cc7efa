"""``scaffold run``: build the components a config names, run every episode, write the results."""

from __future__ import annotations

import asyncio
import heapq
import logging
import signal
import sqlite3
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .._meta import bare_name
from ..config import Config
from ..distributed.env import DistEnv
from ..distributed.ports import rank_slice
from ..engine import RunInfo
from ..episode import EpisodeContext, EpisodeResult
from ..errors import DataError, RunDirError
from ..output import STORE, RunOutput, expand_output_dir, store_paths
from ..output.export import ExportProcess
from ..plugins import get_plugins
from ..plugins.lifecycle import Hooks
from ..spans import clock
from ..task import episode_context, episode_id_of
from .assembly import Components, Limits, started
from .finalize import export_apart, finalize_run_dir
from .metrics import RunMetrics
from .otel import EpisodeTraces
from .otel import wanted as otel_wanted
from .progress import BAR_INTERVAL_S, Progress, run_status
from .provenance import write_provenance
from .runtime import Runtime
from .verifier_pool import VerifierPool

log = logging.getLogger("scaffold.rollout")


def shard(index: int, rank: int, world_size: int) -> bool:
    return index % world_size == rank


class Rollout:
    """One process's share of a run (rank ``rank`` of ``world_size``)."""

    def __init__(self, config: Config, *, output_dir: str | Path | None = None, resume: bool = False,
                 dist: DistEnv | None = None, progress: bool | None = None, registry: Any = None,
                 plugins: Any = None, store_name: str = STORE, finalize: bool = True, prepared: bool = False,
                 force_config: bool = False, answers_per_episode: int | None = None, teacher: Any = None):
        """``dist``: this process's place among the run's workers (one process when omitted).
        ``answers_per_episode``: the progress counts answers, this many per episode (``scaffold eval``).
        ``teacher``: a :class:`~scaffold_core.teacher.Teacher` (not started) that scores every episode's
        training sequences (started after the engine, its tokenizer checked against the engine's, closed at
        the end).
        ``prepared``: a launcher already prepared the output directory; only the own store is opened.
        Otherwise this rollout holds the directory's lock from here until :meth:`run` returns (or
        :meth:`release`), and a ``resume`` with a config other than the saved one is refused unless
        ``force_config``."""
        self.config = config
        self.plugins = plugins or get_plugins()
        self.registry = registry or self.plugins.registry
        self.dist = dist or DistEnv()
        self.dir = Path(output_dir) if output_dir is not None else expand_output_dir(config)
        # Both of these validate before any model loads.
        self.components = Components.from_config(config, self.registry)
        self.limits = Limits.from_config(config)
        self.output = RunOutput(self.dir, resume=resume, overwrite=config.output.overwrite, store_name=store_name,
                                prepared=prepared, config=config, force_config=force_config)
        self.progress = config.rollout.progress if progress is None else progress
        self.answers_per_episode = answers_per_episode
        self.teacher = teacher
        self.finalize_outputs = finalize
        self.metrics = RunMetrics()
        self.hooks = Hooks(self.plugins.pm)
        self.interrupted: str | None = None
        self.runtime: Runtime | None = None
        self.traces: Any = None  # OpenTelemetry export of each episode's spans, when asked for (run/otel.py)
        self._write_error: BaseException | None = None  # a deferred store write that failed (see _result_sink)
        self._drain: Callable[[], None] = lambda: None  # records the episodes finished but not yet written
        self._decoded_at_start = 0  # the engine's live token count when the episodes started
        self.follower: ExportProcess | None = None  # exports the run as it goes (see _follow)
        self._started: list[int] = []  # a heap of the indexes of episodes started and not finished
        self._running: Counter[int] = Counter()
        self._next_index = 0  # past the last index started

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    # -- episodes -------------------------------------------------------
    def _rows(self, done: set[str]) -> _ShardRows:
        """This shard's rows, read once to count them (and those still to do) without holding them;
        unusable rows fail here under ``rollout.bad_rows: fail``, before any model loads."""
        task = self.components.task
        try:
            rows = _ShardRows(task, self.rank, self.world_size, done)
        except UnicodeDecodeError as exc:  # a task that reads its files itself; line numbers are its to give
            raise DataError(f"task {self.config.task.name!r}: its data is not UTF-8 ({exc}); save the data files "
                            "as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE -o FIXED)") from None
        skipped = dict(getattr(task, "skipped", None) or {})
        for reason, count in skipped.items():
            self.metrics.skipped_rows[reason] += count
        if skipped and self.config.rollout.bad_rows == "fail":
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
            raise DataError(f"task {self.config.task.name!r}: {sum(skipped.values())} dataset rows are unusable "
                            f"({reasons}); fix the data, or set rollout.bad_rows: skip to skip and count them")
        return rows

    def _contexts(self, rows: Iterable[tuple[int, dict[str, Any]]], done: set[str]) -> Iterator[Any]:
        task = self.components.task
        tokenizer = self.components.engine.tokenizer
        sampling = self.config.sampling.params()
        for index, row in rows:
            episode_id = episode_id_of(row, index)
            if episode_id in done:
                continue
            if not self._running[index]:
                heapq.heappush(self._started, index)
            self._running[index] += 1
            self._next_index = index + 1
            try:
                yield episode_context(task, index, row, tokenizer, sampling)
            except Exception as exc:  # this row only
                yield EpisodeResult(episode_id=episode_id, index=index, status="failed", reference=task.reference(row),
                                    error=f"building the prompt failed: {type(exc).__name__}: {exc}",
                                    error_component="task", row=row)

    # -- running --------------------------------------------------------
    async def run_async(self) -> dict[str, Any]:
        cfg = self.config
        done = self.output.completed_ids()
        self.hooks.run_start(cfg, str(self.dir))
        try:
            rows = self._rows(done)  # bad data fails here, before any model loads
            if self.rank == 0:  # only now: a start that fails on its data leaves no config behind
                self.output.write_config(cfg)
            async with started(self.components, self.limits, run_info=self._run_info(),
                               verifier_name=cfg.verifier.name) as pool:
                if self.rank == 0:  # the engine has started: it knows the model it resolved and its tokenizer
                    write_provenance(self.dir, cfg.to_dict(), registry=self.registry, engine=self.components.engine,
                                     private=cfg.output.private)
                todo = rows.todo
                self.metrics.resumed = rows.count - todo  # this shard's share (other workers append theirs meanwhile)
                if self.teacher is not None:
                    await self._start_teacher()
                self.runtime = self._runtime(pool)
                bar = self._progress(todo)
                ticker = None
                try:
                    self.metrics.restart_clock()  # tokens/s and wall time exclude model loading
                    bar.restart()
                    self.output.open()
                    self._follow(rows.count)
                    on_result = self._result_sink(bar)
                    if bar.enabled:
                        ticker = asyncio.ensure_future(self._tick(bar))
                    with _signals(self):
                        await self.runtime.run(self._pre_failed(self._contexts(rows, done), on_result), on_result)
                    self._drain()
                    if self._write_error is not None:
                        self._raise_write_error()
                finally:  # before the components close
                    if ticker is not None:
                        ticker.cancel()
                    bar.close()
                    self._drain()
                    self.output.close()
                    if self.traces is not None:
                        self.traces.close()
                    if self.teacher is not None:
                        await self.teacher.close()
        finally:
            self.output.close()  # a run that stopped before its components started
        return self._summary()

    async def _start_teacher(self) -> None:
        from ..teacher import check_same_tokenizer

        try:
            await self.teacher.start()
            student = getattr(self.components.engine, "tokenizer", None)
            if student is not None and self.teacher.tokenizer is not None:
                check_same_tokenizer(student, self.teacher.tokenizer)
        except BaseException:
            await self.teacher.close()
            raise

    def _run_info(self) -> RunInfo:
        """Where the engine runs: output dir, rank and this worker's port slice."""
        dist = self.dist
        port_range = rank_slice(dist.local_rank, dist.local_world_size)  # ports are per host: the rank on this host
        return RunInfo(output_dir=self.dir, rank=dist.rank, world_size=dist.world_size, local_rank=dist.local_rank,
                       port_range=port_range)

    def _runtime(self, pool: VerifierPool | None) -> Runtime:
        comps = self.components
        zero = clock()
        output = self.config.output
        if output.spans and otel_wanted(output.otel) and self.traces is None:
            self.traces = EpisodeTraces(zero)
        return Runtime(engine=comps.engine, controller=comps.controller, verifier=pool,
                       trajectory_maker=comps.trajectory_maker, hooks=self.hooks,
                       engine_name=bare_name(self.config.engine.name), limits=self.limits,
                       record_spans=output.spans, clock_zero=zero, traces=self.traces, teacher=self.teacher)

    def _progress(self, todo: int) -> Progress:
        n = self.answers_per_episode
        return Progress(todo * (n or 1), enabled=self.progress, unit="ans" if n else "ep",
                        desc="answers" if n else "episodes", position=self.rank if self.world_size > 1 else None,
                        status=self._status)

    def _status(self) -> str:
        """The progress's status: samples, generated tokens (the engine's live count while a batch decodes),
        tokens/s, reward, failures."""
        live = getattr(self.components.engine, "decoded_tokens", None)
        tokens = max(self.metrics.generated_tokens, self.runtime.returned_tokens if self.runtime else 0)
        if isinstance(live, int) and not isinstance(live, bool):
            tokens = max(tokens, live - self._decoded_at_start)
        return run_status(self.metrics, tokens, self.metrics.wall_s)

    async def _tick(self, bar: Progress) -> None:
        """Refresh the progress while episodes run, so that a batch decoding for minutes is seen to move."""
        while True:
            await asyncio.sleep(min(bar.interval, BAR_INTERVAL_S))
            bar.tick()

    def _result_sink(self, bar: Progress) -> Callable[[EpisodeResult], None]:
        """Count each finished episode and move the progress bar; record it at the end of the event loop's step.

        The episodes that finish in one step of the event loop are recorded together at its end, in one
        transaction of the store: the first schedules the flush, which runs once the step's callbacks have.
        A flush that fails stops the run, and the error is raised when the runtime returns; the run's end
        (or its stop) flushes what is left (:attr:`_drain`)."""
        loop = asyncio.get_running_loop()
        live = getattr(self.components.engine, "decoded_tokens", None)
        self._decoded_at_start = live if isinstance(live, int) else 0
        per_episode = self.answers_per_episode
        output = self.output
        output.deferred = True
        pending: list[EpisodeResult] = []

        def flush() -> None:
            done = pending[:]
            pending.clear()
            try:
                for result in done:
                    output.append(result)
                output.flush()
                if self.follower is not None:
                    self.follower.mark(self._final_below())
            except BaseException as exc:
                if self._write_error is None:
                    self._write_error = exc
                if self.runtime is not None:
                    self.runtime.cancel_in_flight()

        self._drain = flush

        def on_result(result: EpisodeResult) -> None:
            if not pending:
                loop.call_soon(flush)
            pending.append(result)
            if self._running[result.index] > 0:
                self._running[result.index] -= 1
            self.metrics.add(result)
            if bar.enabled:
                bar.advance(per_episode or 1)

        return on_result

    def _follow(self, rows: int) -> None:
        """A large run that exports its own files has them written by a process of its own as it goes
        (:class:`~scaffold_core.output.export.ExportProcess`, on a core to spare): told, after each write, the
        index below which every episode is in the store for good, it writes them, so that little is left at
        the end."""
        if not self.finalize_outputs or not export_apart(rows):
            return
        paths = store_paths(self.dir)
        if paths != [self.output.store_path]:  # a worker's store left by an earlier session: merged at the end
            return
        output = self.config.output
        self.follower = ExportProcess(self.dir, paths, dataset=output.save_dataset, parquet=output.save_parquet,
                                      private=output.private)

    def _final_below(self) -> int:
        """The index below which every episode of this session has finished (and was handed to the store)."""
        started, running = self._started, self._running
        while started and running[started[0]] <= 0:
            del running[heapq.heappop(started)]
        return started[0] if started else self._next_index

    def _raise_write_error(self) -> None:
        exc = self._write_error
        if not isinstance(exc, (OSError, sqlite3.Error)):
            raise exc  # type: ignore[misc]  # an interrupt, or a bug: as it is
        raise RunDirError(f"writing the episode store {self.output.store_path} failed ({type(exc).__name__}: "
                          f"{exc}): the run stopped, and the episodes that write held are not in it. Fix its cause "
                          "(a full disk, a file system gone), then --resume the run: they run again",
                          path=str(self.output.store_path)) from exc

    def _pre_failed(self, items: Iterator[Any], on_result: Any) -> Iterator[EpisodeContext]:
        """Report episodes that failed before running (bad prompt) and pass the rest on."""
        for item in items:
            if isinstance(item, EpisodeResult):
                self.hooks.episode_end(item)
                on_result(item)
            else:
                yield item

    def _summary(self) -> dict[str, Any]:
        engine_stats = {}
        try:
            engine_stats = self.components.engine.stats()
        except Exception:
            pass
        summary = self.metrics.summary(engine=engine_stats)
        if self.hooks.errors:
            summary["hook_errors"] = dict(self.hooks.errors)
        if self.metrics.resumed:
            summary["resumed_episodes"] = self.metrics.resumed
        if self.interrupted:
            summary["interrupted"] = self.interrupted
        return summary

    def finalize(self, live: dict[str, Any], on_head: Callable[[dict[str, Any]], None] | None = None
                 ) -> dict[str, Any]:
        """Export samples, failures, the dataset and metrics from the store; returns metrics (``on_head``: see
        :func:`~.finalize.finalize_run_dir`)."""
        follower, self.follower = self.follower, None
        return finalize_run_dir(self.dir, live, hooks=self.hooks, save_dataset=self.config.output.save_dataset,
                                save_parquet=self.config.output.save_parquet,
                                skipped_rows=self.metrics.skipped_rows, private=self.config.output.private,
                                sessions=self.metrics, on_head=on_head, follower=follower)

    def run(self, on_head: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Run every episode, then (unless a launcher finalizes) export the run's files; returns metrics (a
        worker's: its live metrics, with its totals under ``totals``)."""
        try:
            live = asyncio.run(self.run_async())
            if not self.finalize_outputs:
                live["totals"] = self.metrics.state()
                return live
            return self.finalize(live, on_head)
        finally:
            self.release()

    def release(self) -> None:
        """Stop the export's process if the run did not finish, and give the output directory's lock back (done
        by :meth:`run`)."""
        if self.follower is not None:
            self.follower.kill()
            self.follower = None
        self.output.release()


class _ShardRows:
    """The ``(index, row)`` pairs of one shard of a task's rows, iterable again and again without being held.

    Made by reading ``task.load()`` once, counting the shard's rows and those whose episode is not in
    ``done``. A task whose ``load()`` returns a sequence (a list) is read from that sequence each time;
    otherwise each iteration calls ``load()`` again (the task contract: loading is repeatable), so rows a
    generator makes are never all in memory at once.
    """

    def __init__(self, task: Any, rank: int, world_size: int, done: set[str]):
        self.task = task
        self.rank = rank
        self.world_size = world_size
        loaded = task.load()
        self._rows: Sequence[dict[str, Any]] | None = loaded if isinstance(loaded, Sequence) else None
        self.count = self.todo = 0
        for index, row in self._shard(loaded):
            self.count += 1
            self.todo += episode_id_of(row, index) not in done

    def _shard(self, rows: Iterable[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
        rank, world_size = self.rank, self.world_size
        for index, row in enumerate(rows):
            if shard(index, rank, world_size):
                yield index, row

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        return self._shard(self._rows if self._rows is not None else self.task.load())

    def __len__(self) -> int:
        return self.count


class _signals:
    """First SIGINT/SIGTERM: stop taking episodes and let in-flight ones finish within
    ``rollout.shutdown_timeout``; a second signal (or the timeout) cancels them."""

    def __init__(self, rollout: Rollout):
        self.rollout = rollout
        self.installed: list[int] = []

    def __enter__(self) -> _signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._handle, sig)
                self.installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
                pass
        return self

    def _handle(self, sig: int) -> None:
        rollout = self.rollout
        runtime = rollout.runtime
        name = signal.Signals(sig).name
        loop = asyncio.get_running_loop()
        if rollout.interrupted is None:
            rollout.interrupted = name
            timeout = rollout.config.rollout.shutdown_timeout
            print(f"\nscaffold: {name} received: finishing episodes in flight (up to {timeout:g} s); "
                  "send it again to stop now", file=sys.stderr)
            if runtime is not None:
                runtime.stopping = True
            loop.call_later(timeout, self._cancel_all)
        else:
            self._cancel_all()

    def _cancel_all(self) -> None:
        runtime = self.rollout.runtime
        if runtime is not None:
            runtime.cancel_in_flight()

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.installed:
            loop.remove_signal_handler(sig)
