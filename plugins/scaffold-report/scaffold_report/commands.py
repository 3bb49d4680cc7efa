"""The ``scaffold report`` and ``scaffold eval`` commands (added through the ``register_commands`` hook), and the
reporter that writes ``report.html`` at the end of ``scaffold run`` and ``scaffold train``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from scaffold_core.errors import ConfigError
from scaffold_core.run.arguments import add_run_arguments, run_overrides
from scaffold_core.run.summary import ExitCode, exit_code_for, exit_reason


def add_commands(sub: argparse._SubParsersAction) -> None:
    """``scaffold eval``, ``scaffold report`` and ``scaffold score``."""
    _eval_parser(sub)
    _report_parser(sub)
    _score_parser(sub)


def _score_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="re-score saved responses with a verifier")
    p.add_argument("--verifier", required=True, help="verifier name (see `scaffold list-plugins --all`)")
    p.add_argument("--input", required=True, help="JSONL file; each line has 'response' and 'answer'")
    p.add_argument("--output", help="write each line with 'reward' and 'extracted' added")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="verifier option, e.g. --option mode=flexible (repeatable)")
    p.set_defaults(handler=cmd_score)


class Reporter:
    """Counts each episode as a run exports its files, then writes the run's report (the ``run_reporter`` hook)."""

    def __init__(self) -> None:
        from .episodes import Stats

        self.stats = Stats()

    def count(self, head: dict[str, Any]) -> None:
        self.stats.add(self.stats.episodes, head)

    def write(self, directory: str | Path, tokenizer: Any = None) -> Path | None:
        from .build import report_at_end

        options: dict[str, Any] = {"stats": self.stats} if self.stats.episodes else {}
        if tokenizer is not None:
            options["tokenizer"] = tokenizer
        return report_at_end(directory, **options)


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="max(k) answers per problem with any controller, then pass@k, pass^k, "
                                    "majority@k and best-of-N@k per k, with bootstrap intervals")
    add_run_arguments(p)
    p.add_argument("--k", default="1,2,4,8,16", help="the ks to report, comma-separated (default 1,2,4,8,16); "
                                                     "max(k) answers are drawn per problem")
    p.add_argument("--workers", type=int, help="worker processes (overrides rollout.workers)")
    p.add_argument("--select", default="reward", metavar="SCORE",
                   help="how best-of-N picks: reward (the run's verifier, default), logprob (the mean token "
                        "logprob), or the name of another installed verifier (a reward model) scoring each answer")
    p.add_argument("--teacher", metavar="MODEL_OR_OPTIONS",
                   help="a teacher that scores every answer's tokens (the teacher-student KL per answer, in eval.json, "
                        "the table and the report): a checkpoint folder, or its options as a YAML mapping, e.g. "
                        "'{engine: vllm, url: http://localhost:8000, model: big}' (as a trainer's teacher:)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="bootstrap resamples over problems for the 95%% intervals (0: none; default 1000)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--no-report", action="store_true", help="do not write report.html at the end")
    p.set_defaults(handler=cmd_eval)


def _report_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write one offline report.html for a run, eval or train directory; given "
                                      "several, one page comparing them")
    p.add_argument("run_dir", nargs="+", metavar="RUN_DIR",
                   help="the directory a `scaffold run`, `eval` or `train` wrote; several: a comparison page "
                        "overlaying them (runs and evals together, or training runs together)")
    p.add_argument("-o", "--output", help="where to write the page (default: RUN_DIR/report.html; comparing: "
                                          "compare.html here)")
    p.add_argument("--max-episodes", type=int, default=None, metavar="N",
                   help="episodes the trajectory browser carries in full (default 300; past it, a stratified sample)")
    p.add_argument("--trace-episodes", type=int, default=None, metavar="N",
                   help="episodes trace.json holds, the first to start (default 2,000; 0: no trace.json)")
    p.add_argument("--tokenizer", help="a local tokenizer or model folder for the token texts (default: the run's "
                                       "engine's)")
    p.set_defaults(handler=cmd_report)




def cmd_eval(args: argparse.Namespace) -> int:
    from scaffold_core.config import load_config
    from scaffold_core.run.metrics import truncation_warning, unscored_warning
    from scaffold_core.run.summary import failure_report

    from .eval.command import format_table, run_eval
    from .eval.figures import Bootstrap, parse_ks

    try:
        ks = parse_ks(args.k)
        bootstrap = Bootstrap(resamples=args.bootstrap)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    config = load_config(args.config, run_overrides(args))  # validates everything before any model loads
    result = run_eval(config, ks, output_dir=args.output, resume=args.resume,
                      progress=False if args.no_progress else None, force_config=args.force_config,
                      select=args.select, bootstrap=bootstrap, teacher=_teacher_option(args.teacher))
    print(format_table(result.figures))
    metrics = result.metrics
    for message in (failure_report(metrics), unscored_warning(metrics), truncation_warning(
            metrics.get("truncated_fraction", 0.0))):
        if message:
            print(message, file=sys.stderr)
    print(f"scaffold: figures: {result.directory / 'eval.json'}", file=sys.stderr)
    if not args.no_report:
        from .build import report_at_end

        report_at_end(result.directory, **({"tokenizer": result.tokenizer} if result.tokenizer is not None else {}))
    limit = config.rollout.max_failed_fraction
    code = exit_code_for(metrics, limit)
    reason = exit_reason(code, metrics, limit)
    if reason:
        print(reason, file=sys.stderr)
    return code


def _teacher_option(text: str | None) -> dict[str, Any] | None:
    """``--teacher``: a model folder or name, or a YAML mapping of a teacher's options."""
    if not text:
        return None
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        return {"model": value}
    raise ConfigError(f"--teacher: {text!r} is neither a model (a checkpoint folder) nor a mapping of a teacher's "
                      "options such as '{model: runs/teacher/final, threads: 2}'")


def cmd_report(args: argparse.Namespace) -> int:
    from .build import build_report

    if len(args.run_dir) > 1:
        return _compare(args)
    options: dict = {}
    if args.tokenizer:
        from .tokens import load_tokenizer

        options["tokenizer"] = load_tokenizer(args.tokenizer)
    if args.max_episodes is not None and args.max_episodes < 0:
        raise ConfigError(f"--max-episodes: {args.max_episodes} is not >= 0")
    if args.max_episodes is not None:  # asked for: carried whatever their size
        options.update(max_episodes=args.max_episodes, budget=sys.maxsize)
    if args.trace_episodes is not None:
        if args.trace_episodes < 0:
            raise ConfigError(f"--trace-episodes: {args.trace_episodes} is not >= 0 (0: no trace.json)")
        options["trace_episodes"] = args.trace_episodes
    path = build_report(args.run_dir[0], output=args.output, **options)
    print(path)
    return ExitCode.OK


def _compare(args: argparse.Namespace) -> int:
    from .compare import build_comparison

    for flag, value in (("--max-episodes", args.max_episodes), ("--tokenizer", args.tokenizer),
                        ("--trace-episodes", args.trace_episodes)):
        if value is not None:
            raise ConfigError(f"{flag} applies to the report of one directory; a comparison carries no "
                              "trajectories: leave it out")
    print(build_comparison(args.run_dir, output=args.output))
    return ExitCode.OK


def cmd_score(args: argparse.Namespace) -> int:
    import json

    from .score import score_file

    summary = score_file(args.verifier, args.input, args.output, args.option)
    print(json.dumps(summary, indent=2))
    bad = summary.get("unscored") or []
    if summary.get("no_reward"):
        print(f"scaffold score: {len(summary['no_reward'])} line(s) got no reward from the verifier (listed under "
              "no_reward; written with reward null) and are left out of accuracy and reward_mean", file=sys.stderr)
    for line in bad:
        print(f"error: {args.input}:{line['line']}: not scored: {line['error']}", file=sys.stderr)
    if bad:
        print(f"scaffold score: {len(bad)} line(s) could not be scored (listed above); every other line was "
              "scored" + (f" and written to {args.output}" if args.output else ""), file=sys.stderr)
        return ExitCode.ERROR
    return ExitCode.OK
