"""The end of a run: samples, failures, the trajectories dataset and metrics, from the parts its processes
wrote as they ran or else from the ledgers.

Used by a one-process run and by every launcher after its workers have
ended; needs no components, only the output directory and the ledgers in it
(and the folders of the parts, :mod:`scaffold_core.output.live`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..distributed.env import usable_cores
from ..output import latest_records, ledger_paths, result_of, write_derived
from ..output.files import remove_stale_temps
from ..output.join import join_parts
from ..output.ledger_index import LedgerChanged, LedgerIndex
from ..output.live import PART_NAME
from ..output.parts import write_derived_parts
from ..output.rundir import write_metrics
from ..plugins.lifecycle import Hooks
from .metrics import RunMetrics

log = logging.getLogger("scaffold.finalize")

#: Records per worker process below which the derived files are written by this process alone (a worker
#: process takes about a second to start).
RECORDS_PER_PROCESS = 20_000

#: Live keys that describe this session (a resumed run's totals come from the ledgers instead).
SESSION_KEYS = ("tokens_per_s", "episodes_per_s", "wall_s", "engine", "hook_errors", "interrupted",
                "resumed_episodes", "workers", "worker_failures")


def finalize_run_dir(directory: Path, live: dict[str, Any], *, hooks: Hooks, save_dataset: bool = True,
                     ledgers: list[Path] | None = None, skipped_rows: Mapping[str, int] | None = None,
                     private: bool = True, parts: list[Path] | None = None) -> dict[str, Any]:
    """Write the derived files and ``metrics.json`` of the run in ``directory``; returns the metrics.

    ``parts``: the folders of the derived files this run's sessions wrote as they ran; joined when they
    cover the ledgers exactly (every record of every ledger, written by those sessions), else the files
    are derived from the ledgers. Totals (episodes, rewards, accuracy, failures) are those of every
    ledger record, never read from a previous session's files (a run killed while writing them leaves
    nothing this trusts); throughput and wall time are the live session's own measurements.
    """
    paths = ledgers or ledger_paths(directory)
    try:
        totals = _join(directory, parts, paths, save_dataset, private) if parts else None
        if totals is None:
            totals = _derive(directory, paths, save_dataset, private)
    finally:
        remove_stale_temps(directory, [PART_NAME])  # every process of the run has ended: no part is in use
    totals.skipped_rows.update(skipped_rows or {})
    metrics = totals.summary()
    for key in SESSION_KEYS:
        if key in live:
            metrics[key] = live[key]
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


def _join(directory: Path, parts: list[Path], paths: list[Path], save_dataset: bool, private: bool
          ) -> RunMetrics | None:
    """The totals of the run when its parts cover the ledgers (and are put in place), else None."""
    try:
        manifests = join_parts(directory, parts, paths, save_dataset=save_dataset, private=private)
        return None if manifests is None else RunMetrics.from_states([m["metrics"] for m in manifests])
    except Exception as exc:  # a part damaged meanwhile: the ledgers have everything (the files are rewritten)
        log.warning("joining the derived files written as the run went failed (%s: %s); deriving them from the "
                    "ledgers", type(exc).__name__, exc)
        return None


def _derive(directory: Path, paths: list[Path], save_dataset: bool, private: bool) -> RunMetrics:
    """The derived files from the ledgers; the totals of every record."""
    totals = _derive_streaming(directory, paths, save_dataset, private)
    if totals is None:  # a ledger the index cannot describe exactly: every record in memory, as before
        records = latest_records(paths)
        totals = RunMetrics()
        for record in records.values():
            totals.add(result_of(record))
        write_derived(directory, records, save_dataset=save_dataset, private=private)
    return totals


def _derive_streaming(directory: Path, paths: list[Path], save_dataset: bool, private: bool) -> RunMetrics | None:
    """Write the derived files reading the ledgers a record at a time; the totals of every episode (added
    in the order the episodes first appear, as ``latest_records`` orders them), or None when the ledgers
    need the in-memory path."""
    seen = RunMetrics()  # every line as it is read: the totals, unless some episode has several lines
    with LedgerIndex(paths, on_head=lambda head: seen.add(result_of(head))) as index:
        if not index.exact:
            return None
        try:
            _write(directory, index, save_dataset, private)
            if not index.duplicates:
                return seen
            totals = RunMetrics()
            for head in index.heads_in_ledger_order():
                totals.add(result_of(head))
            return totals
        except LedgerChanged:
            return None


def _write(directory: Path, index: LedgerIndex, save_dataset: bool, private: bool) -> None:
    """The derived files from ``index``: in consecutive parts on several cores when there are many records."""
    parts = min(usable_cores(), len(index) // RECORDS_PER_PROCESS)
    if parts >= 2:
        try:
            write_derived_parts(directory, index.parts(parts), save_dataset=save_dataset,
                                passes=index.packed_records, private=private)
            return
        except LedgerChanged:
            raise
        except Exception as exc:  # worker processes unavailable here: one process writes it all
            log.warning("writing the derived files in %d processes failed (%s: %s); writing them in one",
                        parts, type(exc).__name__, exc)
    write_derived(directory, index.packed_records, save_dataset=save_dataset, private=private)
