"""What a finished run tells its user: the summary printed at the end, and the process's exit code."""

from __future__ import annotations

import enum
import json
import sys
from typing import Any

from ..tool import UNISOLATED_METRIC
from .metrics import truncation_warning, unscored_warning


class ExitCode(enum.IntEnum):
    """Exit codes of ``scaffold`` and of ``python -m scaffold_core.launch.worker`` (one table, documented in
    docs/reliability.md)."""

    OK = 0
    #: A user error (bad config, missing file, a run directory in use), a failed worker, or
    #: ``scaffold score`` lines that could not be scored.
    ERROR = 1
    #: The command line itself is wrong.
    USAGE = 2
    #: The run finished but every episode failed (engine down, verifier crashing, every row unusable).
    ALL_FAILED = 3
    #: The run finished but more than ``rollout.max_failed_fraction`` of its episodes failed.
    TOO_MANY_FAILED = 4
    #: Stopped by Ctrl-C or SIGTERM; finished episodes are kept, ``--resume`` continues.
    INTERRUPTED = 130


def exit_code_for(metrics: dict[str, Any], max_failed_fraction: float = 0.5) -> ExitCode:
    """The exit code of a run that ended with ``metrics`` (whole-run totals)."""
    if metrics.get("interrupted"):
        return ExitCode.INTERRUPTED
    if metrics.get("worker_failures"):
        return ExitCode.ERROR
    episodes, failed = int(metrics.get("episodes") or 0), int(metrics.get("failed") or 0)
    if episodes and failed >= episodes:
        return ExitCode.ALL_FAILED
    if episodes and failed / episodes > max_failed_fraction:
        return ExitCode.TOO_MANY_FAILED
    return ExitCode.OK


def failure_report(metrics: dict[str, Any]) -> str:
    """``N of M episodes failed (P%); top causes: ...`` with counts, or '' when none failed."""
    failed, episodes = int(metrics.get("failed") or 0), int(metrics.get("episodes") or 0)
    if not failed:
        return ""
    lines = [f"scaffold: {failed} of {episodes} episodes failed ({failed / max(episodes, 1):.0%}); "
             "top causes (see failures.jsonl):"]
    causes = metrics.get("top_failure_causes") or [{"component": c, "error": metrics.get("failure_examples", {})
                                                    .get(c, ""), "count": n}
                                                   for c, n in (metrics.get("failures") or {}).items()]
    for cause in causes:
        lines.append(f"  {cause['count']:>6} x {cause['component']}: {cause['error']}")
    return "\n".join(lines)


def exit_reason(code: int, metrics: dict[str, Any], max_failed_fraction: float = 0.5) -> str:
    """Why a finished run exits non-zero because of its failures ('' for other codes)."""
    if code == ExitCode.ALL_FAILED:
        return f"scaffold: every episode failed: exit code {int(code)}"
    if code == ExitCode.TOO_MANY_FAILED:
        fraction = int(metrics.get("failed") or 0) / max(int(metrics.get("episodes") or 0), 1)
        return (f"scaffold: {fraction:.0%} of the episodes failed, more than rollout.max_failed_fraction="
                f"{max_failed_fraction:g}: exit code {int(code)}")
    return ""


def _rows(rows: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def format_run_summary(metrics: dict[str, Any]) -> str:
    """A few lines a person reads at the end of a run (``metrics.json`` keeps every figure)."""
    episodes, failed = int(metrics.get("episodes") or 0), int(metrics.get("failed") or 0)
    rows = [("episodes", f"{episodes:,} ({failed:,} failed)" if failed else f"{episodes:,} (none failed)")]
    samples = f"{int(metrics.get('samples') or 0):,}"
    if metrics.get("unscored_samples"):
        samples += f" ({int(metrics['unscored_samples']):,} unscored)"
    rows.append(("samples", samples))
    skipped = metrics.get("skipped_rows") or {}
    if skipped:
        rows.append(("skipped rows", ", ".join(f"{n:,} {reason}" for reason, n in sorted(skipped.items()))))
    rows.append(("accuracy", f"{float(metrics.get('accuracy') or 0.0):.3f}   reward mean "
                             f"{float(metrics.get('reward_mean') or 0.0):.3f}"))
    extra = [f"{k} {float(v):.3f}" for k, v in metrics.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and ("@" in k or "^" in k)]
    if extra:
        rows.append(("per episode", "   ".join(extra)))
    tokens = f"{int(metrics.get('generated_tokens') or 0):,} generated"
    if metrics.get("tokens_per_s") is not None:
        tokens += f", {float(metrics['tokens_per_s']):,.1f} tok/s"
    if metrics.get("wall_s") is not None:
        tokens += f" over {float(metrics['wall_s']):,.1f} s"
    tokens += f"; {float(metrics.get('truncated_fraction') or 0.0):.1%} truncated"
    rows.append(("tokens", tokens))
    if metrics.get("output_dir"):
        rows.append(("output", f"{metrics['output_dir']} (every figure in metrics.json; --json prints it)"))
    return _rows(rows)


def format_train_summary(summary: dict[str, Any], output_dir: Any) -> str:
    """A few lines a person reads at the end of ``scaffold train`` (``train_summary.json`` keeps it all)."""
    steps = f"{summary.get('steps', 0)}"
    if summary.get("optimizer_steps") is not None:
        steps += f" ({summary['optimizer_steps']} optimizer steps)"
    if summary.get("resumed_from"):
        steps += f", resumed from {summary['resumed_from']}"
    rows = [("steps", steps)]
    for key, label in (("train_loss", "train loss"), ("reward_mean", "reward mean")):
        if isinstance(summary.get(key), (int, float)):
            rows.append((label, f"{summary[key]:.4g}"))
    on_disk = summary.get("rollouts_on_disk") or {}
    if on_disk:
        rows.append(("rollouts", f"{on_disk.get('episodes') or 0:,} episodes, {on_disk.get('samples') or 0:,} "
                                 f"samples, {on_disk.get('failed') or 0:,} failed"))
    if summary.get("wall_s") is not None:
        rows.append(("wall", f"{float(summary['wall_s']):,.1f} s"))
    rows.append(("output", f"{output_dir} (train_summary.json, train_metrics.jsonl; --json prints the summary)"))
    return _rows(rows)


def print_summary(metrics: dict[str, Any], *, as_json: bool = False) -> None:
    """A short summary on stdout (``as_json``: the metrics as JSON, for scripts); failures, unscored samples,
    truncation and interruption explained on stderr."""
    print(json.dumps(metrics, indent=2) if as_json else format_run_summary(metrics))
    report = failure_report(metrics)
    if report:
        print(report, file=sys.stderr)
    unscored = unscored_warning(metrics)
    if unscored:
        print(unscored, file=sys.stderr)
    for warning in (truncation_warning(metrics.get("truncated_fraction", 0.0)), unisolated_warning(metrics)):
        if warning:
            print("\n" + "!" * 78 + "\n" + warning + "\n" + "!" * 78, file=sys.stderr)
    if metrics.get("interrupted"):
        print(f"scaffold: interrupted by {metrics['interrupted']}; continue with --resume", file=sys.stderr)


def unisolated_warning(metrics: dict[str, Any]) -> str | None:
    """The loud message for runs whose agents ran model-written code without kernel isolation, else None."""
    if not metrics.get(UNISOLATED_METRIC):
        return None
    return (f"WARNING: this run's agents had tools that ran model-written code without kernel isolation "
            f"({UNISOLATED_METRIC}: {metrics[UNISOLATED_METRIC]:g} per episode; isolation: none). Only run trusted "
            "code this way; remove isolation: none to run it in the bubblewrap jail.")


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
