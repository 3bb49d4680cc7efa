"""The end of a run: derive samples, failures, the trajectories dataset and metrics from the ledgers.

Used by a one-process run and by every launcher after its workers have
ended; needs no components, only the output directory and the ledgers in it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..output import latest_records, ledger_paths, result_of, write_derived
from ..output.rundir import write_metrics
from ..plugins.lifecycle import Hooks
from .metrics import RunMetrics

#: Live keys that describe this session (a resumed run's totals come from the ledgers instead).
SESSION_KEYS = ("tokens_per_s", "episodes_per_s", "wall_s", "engine", "hook_errors", "interrupted",
                "resumed_episodes", "workers", "worker_failures")


def finalize_run_dir(directory: Path, live: dict[str, Any], *, hooks: Hooks, save_dataset: bool = True,
                     ledgers: list[Path] | None = None, skipped_rows: Mapping[str, int] | None = None,
                     private: bool = True) -> dict[str, Any]:
    """Write the derived files and ``metrics.json`` of the run in ``directory``; returns the metrics.

    Totals (episodes, rewards, accuracy, failures) are computed from every ledger record, never read
    from a previous session's files (a run killed while writing them leaves nothing this trusts);
    throughput and wall time are the live session's own measurements.
    """
    records = latest_records(ledgers or ledger_paths(directory))
    totals = RunMetrics()
    totals.skipped_rows.update(skipped_rows or {})
    for record in records.values():
        totals.add(result_of(record))
    metrics = totals.summary()
    for key in SESSION_KEYS:
        if key in live:
            metrics[key] = live[key]
    if "resumed_episodes" in live:
        metrics["session"] = {k: live[k] for k in ("episodes", "completed", "failed", "generated_tokens")}
    write_derived(directory, records, save_dataset=save_dataset, private=private)
    metrics["output_dir"] = str(directory)
    write_metrics(directory, metrics, private=private)
    before = Counter(hooks.errors)
    hooks.run_end(metrics, str(directory))  # after metrics.json exists: a hook may read or upload it
    raised = Counter(hooks.errors) - before
    if raised:  # count on_run_end's errors too, like every lifecycle hook's
        metrics["hook_errors"] = dict(Counter(metrics.get("hook_errors") or {}) + raised)
        write_metrics(directory, metrics, private=private)
    return metrics
