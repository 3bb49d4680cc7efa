"""The end of a run: the workers' stores merged, samples, failures, the trajectories dataset and metrics
exported from the run's store.

Used by a one-process run and by every launcher after its workers have
ended; needs no components, only the output directory and the stores in it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..distributed.env import usable_cores
from ..output import export_run, merge_stores, result_of, store_paths
from ..output.export import ExportProcess
from ..output.rundir import write_metrics
from ..output.store import RANK_STORE_GLOB, count_episodes, remove_store
from ..plugins.lifecycle import Hooks
from .metrics import RunMetrics

#: Episodes from which a process of its own writes the exported files (on a machine with a core to spare; a
#: one-process run's as it goes, see scaffold_core.output.export.ExportProcess): it takes a tenth of a second
#: to start.
EXPORT_PROCESS_EPISODES = 5_000
#: Live keys that describe this session (a resumed run's totals come from the store instead).
SESSION_KEYS = ("tokens_per_s", "episodes_per_s", "wall_s", "engine", "hook_errors", "interrupted",
                "resumed_episodes", "workers", "worker_failures")


def finalize_run_dir(directory: Path, live: dict[str, Any], *, hooks: Hooks, save_dataset: bool = True,
                     save_parquet: bool = False, skipped_rows: Mapping[str, int] | None = None, private: bool = True,
                     sessions: RunMetrics | None = None,
                     on_head: Callable[[dict[str, Any]], None] | None = None,
                     follower: ExportProcess | None = None) -> dict[str, Any]:
    """Merge the workers' stores, export the run's files and write ``metrics.json``; returns the metrics.

    Totals (episodes, rewards, accuracy, failures) are those of every episode in the store, never read from
    a previous session's files (a run killed while writing them leaves nothing this trusts): ``sessions``,
    the totals this run's sessions counted as their episodes finished, when the store holds exactly their
    episodes (a session records each episode once, and never one that was complete), else every episode's
    added in ``(index, episode_id)`` order. Throughput and wall time are the live session's own measurements.
    ``on_head``: given every episode's record without its training sequences, in that order. ``follower``: the
    process that exported the run as it ran (see :func:`~scaffold_core.output.export.export_run`).
    """
    directory = Path(directory)
    paths = store_paths(directory)
    merge = _Merge(directory, private) if any(directory.glob(RANK_STORE_GLOB)) else None
    if merge is not None and follower is not None:  # it follows episodes.db alone
        follower.kill()
        follower = None
    exported = False
    try:  # the export reads the workers' stores while they are merged
        # An episode in several stores (resumed, not merged yet) makes the sum larger than any session's count.
        stored = sum(map(count_episodes, paths))
        totals = sessions if sessions is not None and sessions.episodes == stored else None
        if totals is None:
            totals = RunMetrics()
            count = totals.add
            on_head = (lambda head: count(result_of(head))) if on_head is None else _both(on_head, count)
        if follower is None and export_apart(stored):
            follower = ExportProcess(directory, paths, dataset=save_dataset, parquet=save_parquet, private=private)
        export_run(directory, paths, save_dataset=save_dataset, save_parquet=save_parquet, private=private,
                   on_head=on_head, follower=follower)
        follower = None
        exported = True
    finally:
        if follower is not None:
            follower.kill()
        if merge is not None:
            merge.finish(raise_error=exported)  # after a failed export, its error is the one to see
    totals.skipped_rows = Counter(skipped_rows or {})
    metrics = totals.summary()
    for key in SESSION_KEYS:
        if key in live:
            metrics[key] = live[key]
        elif key in ("tokens_per_s", "episodes_per_s", "wall_s"):
            # no live session measured them (a training run's ledger): the time taken here to read the
            # store is not the run's time, and tokens over it are no throughput
            metrics.pop(key, None)
    if "resumed_episodes" in live:
        metrics["session"] = {k: live[k] for k in ("episodes", "completed", "failed", "generated_tokens")}
    metrics["output_dir"] = str(directory)
    write_metrics(directory, metrics, private=private)
    before = Counter(hooks.errors)
    hooks.run_end(metrics, str(directory))  # after metrics.json exists: a hook may read or upload it
    raised = Counter(hooks.errors) - before
    if raised:  # count on_run_end's errors too, like every lifecycle hook's
        metrics["hook_errors"] = dict(Counter(metrics.get("hook_errors") or {}) + raised)
        write_metrics(directory, metrics, private=private)
    return metrics


def export_apart(episodes: int) -> bool:
    """Whether a process of its own exports a run of ``episodes`` (:data:`EXPORT_PROCESS_EPISODES`)."""
    return episodes >= EXPORT_PROCESS_EPISODES and usable_cores() >= 2


def _both(on_head: Callable[[dict[str, Any]], None], count: Callable[[Any], None]) -> Callable[[dict[str, Any]], None]:
    def both(head: dict[str, Any]) -> None:
        on_head(head)
        count(result_of(head))

    return both


class _Merge(threading.Thread):
    """The workers' stores merged into ``episodes.db`` beside the export (SQLite copies rows without the GIL:
    on a second core the merge costs next to nothing); they are removed once both are done."""

    def __init__(self, directory: Path, private: bool):
        super().__init__(name="scaffold-store-merge", daemon=True)
        self.directory, self.private = directory, private
        self.error: BaseException | None = None
        self.sources = sorted(directory.glob(RANK_STORE_GLOB))
        self.start()

    def run(self) -> None:
        try:
            merge_stores(self.directory, private=self.private, remove=False)
        except BaseException as exc:  # raised by finish(), in the caller's thread
            self.error = exc

    def finish(self, raise_error: bool) -> None:
        """Wait for the merge; remove the stores it merged, or raise its error (they stay for ``--resume``)."""
        self.join()
        if self.error is None:
            for source in self.sources:
                remove_store(source)
        elif raise_error:
            raise self.error
