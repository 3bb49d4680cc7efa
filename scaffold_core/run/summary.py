"""What a finished run tells its user: the summary printed at the end, and the process's exit code."""

from __future__ import annotations

import enum
import json
import sys
from typing import Any

from .metrics import truncation_warning, unscored_warning


class ExitCode(enum.IntEnum):
    """Exit codes of ``scaffold`` and of ``python -m scaffold_core.launch.worker`` (one table, documented in
    docs/reliability.md)."""

    OK = 0
    #: A user error (bad config, missing file) or a failed worker.
    ERROR = 1
    #: The command line itself is wrong.
    USAGE = 2
    #: Stopped by Ctrl-C or SIGTERM; finished episodes are kept, ``--resume`` continues.
    INTERRUPTED = 130


def exit_code_for(metrics: dict[str, Any]) -> ExitCode:
    """The exit code of a run that ended with ``metrics``."""
    if metrics.get("interrupted"):
        return ExitCode.INTERRUPTED
    if metrics.get("worker_failures"):
        return ExitCode.ERROR
    return ExitCode.OK


def print_summary(metrics: dict[str, Any]) -> None:
    """The metrics as JSON on stdout; failures, unscored samples, truncation and interruption explained on stderr."""
    print(json.dumps(metrics, indent=2))
    failed = metrics.get("failed", 0)
    if failed:
        print(f"scaffold: {failed} episode(s) failed: {metrics.get('failures')}; see failures.jsonl",
              file=sys.stderr)
    unscored = unscored_warning(metrics)
    if unscored:
        print(unscored, file=sys.stderr)
    warning = truncation_warning(metrics.get("truncated_fraction", 0.0))
    if warning:
        print("\n" + "!" * 78 + "\n" + warning + "\n" + "!" * 78, file=sys.stderr)
    if metrics.get("interrupted"):
        print(f"scaffold: interrupted by {metrics['interrupted']}; continue with --resume", file=sys.stderr)


def report_failures(metrics: dict[str, Any]) -> None:
    """Tell the user which workers failed, where their logs are, and how to finish the run."""
    for f in metrics.get("worker_failures") or []:
        print(f"scaffold: worker rank {f['rank']} failed ({f['error']}); shard: {f['shard']}; "
              f"log: {f['log']}", file=sys.stderr)
        if f.get("log_tail"):
            lines = f["log_tail"].rstrip().splitlines()[-15:]
            print("  | " + "\n  | ".join(lines), file=sys.stderr)
    if metrics.get("worker_failures"):
        print("scaffold: the other workers' episodes are kept; run the missing ones with --resume",
              file=sys.stderr)
