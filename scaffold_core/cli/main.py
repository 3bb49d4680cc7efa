"""The ``scaffold`` command line: its parser and one function per command.

Heavier imports stay inside the commands so start-up is fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

from .._meta import CORE_DISTRIBUTION, PROJECT_NAME, version
from ..errors import ConfigError, ScaffoldError
from ..run.arguments import add_override_arguments, add_run_arguments
from ..run.summary import ExitCode, exit_code_for, exit_reason, format_train_summary, print_summary
from .new_plugin import KIND_TEMPLATES, create_plugin, next_steps


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROJECT_NAME,
        description="Plugin-based LLM rollout scaffolding for reinforcement learning.",
        epilog="Installed plugins add more commands (the register_commands hook); docs/plugins.md lists which "
               "package adds which command and component.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list-plugins", help="list installed plugins and their components")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--all", action="store_true", help="include the built-in components (as plugin 'builtin')")
    p.add_argument("--show-options", metavar="NAME",
                   help="list the options of the component(s) named NAME (or KIND:NAME): type, default, bounds, help")
    p.set_defaults(handler=cmd_list_plugins)

    p = sub.add_parser("config", help="print the resolved config, with every default filled in")
    p.add_argument("config", help="YAML config file")
    add_override_arguments(p, "sampling.max_tokens=256")
    p.set_defaults(handler=cmd_config)

    p = sub.add_parser("run", help="run a rollout described by a YAML config")
    add_run_arguments(p)
    p.add_argument("--workers", type=int, help="worker processes (overrides rollout.workers)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--no-report", action="store_true", help="do not write report.html at the end")
    p.add_argument("--json", action="store_true", help="end with the metrics as JSON on stdout (for scripts) "
                                                       "instead of the short summary")
    p.set_defaults(handler=cmd_run)

    _eval_parser(sub)

    p = sub.add_parser("train", help="train a policy on scaffold's rollouts with the configured trainer plugin")
    p.add_argument("config", help="YAML config file with a trainer section (e.g. trainer: {name: trl})")
    add_override_arguments(p, "trainer.max_steps=10")
    p.add_argument("-o", "--output", help="output directory for checkpoints and metrics (overrides output.dir)")
    p.add_argument("--overwrite", action="store_true", help="replace a previous training run in the directory")
    p.add_argument("--resume", action="store_true",
                   help="continue the training run in -o DIR from its last checkpoint (the config must match)")
    p.add_argument("--force-config", action="store_true",
                   help="with --resume: continue even though the config changed (recorded in config-history.jsonl)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--no-report", action="store_true", help="do not write report.html at the end")
    p.add_argument("--json", action="store_true", help="end with the trainer's summary as JSON on stdout (for "
                                                       "scripts) instead of the short summary")
    p.set_defaults(handler=cmd_train)

    _report_parser(sub)

    p = sub.add_parser("score", help="re-score saved responses with a verifier")
    p.add_argument("--verifier", required=True, help="verifier name (see `scaffold list-plugins --all`)")
    p.add_argument("--input", required=True, help="JSONL file; each line has 'response' and 'answer'")
    p.add_argument("--output", help="write each line with 'reward' and 'extracted' added")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="verifier option, e.g. --option mode=flexible (repeatable)")
    p.set_defaults(handler=cmd_score)

    p = sub.add_parser("new-plugin", help="create a ready-to-install plugin package (scaffold-NAME)")
    p.add_argument("name", help="the plugin's short name: 'arith' makes scaffold-arith, module scaffold_arith")
    p.add_argument("--kind", default="task",
                   choices=list(KIND_TEMPLATES),
                   help="the component the plugin adds (default: task)")
    p.add_argument("--dir", default=".",
                   help="the folder to create scaffold-NAME/ in, created when missing (default: the current one)")
    p.set_defaults(handler=cmd_new_plugin)
    _plugin_commands(sub)
    return parser


def _plugin_commands(sub: argparse._SubParsersAction) -> None:
    """The commands installed plugins add through the ``register_commands`` hook."""
    from ..plugins import get_plugins

    for warning in get_plugins().add_commands(sub):
        print(f"warning: {warning}", file=sys.stderr)


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
    p.add_argument("--tokenizer", help="a local tokenizer or model folder for the token texts (default: the run's "
                                       "engine's)")
    p.set_defaults(handler=cmd_report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        print(f"{CORE_DISTRIBUTION} {version()}")
        return ExitCode.OK
    if not getattr(args, "handler", None):
        parser.print_help()
        return ExitCode.USAGE
    try:
        return int(args.handler(args) or 0)
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


# ---------------------------------------------------------------------------


def cmd_list_plugins(args: argparse.Namespace) -> int:
    from ..plugins import get_plugins

    if args.show_options:
        return show_options(args.show_options, as_json=args.json)
    infos = get_plugins().plugin_infos(include_builtin=args.all)
    if args.json:
        print(json.dumps([i.to_json() for i in infos], indent=2))
        return ExitCode.OK
    if not infos:
        print("No plugins installed. docs/plugins.md lists the packages that add tasks, engines, commands and "
              "more (wheels built by `make dist` in a scaffold checkout: pip install --find-links dist PACKAGE)")
        return ExitCode.OK
    rows = [("NAME", "DISTRIBUTION", "VERSION", "STATUS", "COMPONENTS")]
    for info in infos:
        comps = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in info.components.items() if names)
        rows.append((info.name, info.distribution or "-", info.version or "-", info.status, comps or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4])
    notes = [f"{info.name}: {note}" for info in infos for note in info.notes]
    if notes:
        print("\n" + "\n".join(notes))
    for info in infos:
        if info.status == "error":
            print(f"\n{info.name}: {info.error}", file=sys.stderr)
    reported: set[tuple[str, str]] = set()
    for info in infos:
        for clash in info.clashes:
            if (clash["kind"], clash["name"]) not in reported:
                reported.add((clash["kind"], clash["name"]))
                print(f"\nname clash: {clash['message']}", file=sys.stderr)
    return ExitCode.OK


def show_options(spec: str, *, as_json: bool = False) -> int:
    """``list-plugins --show-options NAME``: every option each component called NAME declares."""
    from ..plugins import KINDS, get_registry, option_table

    registry = get_registry()
    kind, _, name = spec.rpartition(":") if spec.split(":")[0] in KINDS else ("", "", spec)
    found = []
    for k in ([kind] if kind else list(KINDS)):
        if name in registry.names(k):
            found.append((k, registry.get(k, name)))
    if not found:
        raise ConfigError(f"--show-options: no installed component is called {spec!r}; "
                          "see `scaffold list-plugins --all`")
    tables = {f"{k}:{name}": option_table(info.factory) for k, info in found}
    if as_json:
        print(json.dumps({key: [{"name": o.name, "type": o.type, "default": None if o.default is ... else o.default,
                                 "required": o.default is ..., "bounds": o.bounds, "help": o.help} for o in opts]
                          for key, opts in tables.items()}, indent=2, default=repr))
        return ExitCode.OK
    for key, opts in tables.items():
        print(f"{key}" + ("" if opts else ": no options"))
        for o in opts:
            default = "required" if o.default is ... else f"default {o.default!r}"
            bounds = f", {o.bounds}" if o.bounds else ""
            print(f"  {o.name}: {o.type} ({default}{bounds})" + (f"  {o.help}" if o.help else ""))
    return ExitCode.OK


def cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from ..config import load_config

    config = load_config(args.config, args.overrides)
    sys.stdout.write(yaml.safe_dump(with_option_defaults(config.to_dict()), sort_keys=False,
                                    default_flow_style=False))
    return ExitCode.OK


def with_option_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every option the selected components declare but the config leaves unset, at its default."""
    from ..plugins import SECTION_KINDS, get_registry, option_table

    registry = get_registry()
    plain = (type(None), bool, int, float, str, list, dict)
    for section, kind in SECTION_KINDS.items():
        chosen = data.get(section)
        if not isinstance(chosen, dict) or not chosen.get("name"):
            continue
        for option in option_table(registry.get(kind, chosen["name"]).factory):
            if option.name not in chosen and option.default is not ... and isinstance(option.default, plain):
                chosen[option.name] = option.default
    return data


def _count_head(stats: Any, head: dict[str, Any]) -> None:
    stats.add(stats.episodes, head)


def cmd_run(args: argparse.Namespace) -> int:
    from ..config import load_config

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"rollout.workers={args.workers}")
    if args.overwrite:
        overrides.append("output.overwrite=true")
    config = load_config(args.config, overrides)  # validates everything before any model loads
    progress = False if args.no_progress else None
    # The engine's tokenizer, when it ran in this process, gives the report its token texts.
    report_options: dict[str, Any] = {}
    if config.rollout.workers > 1 or config.rollout.launcher != "local":
        from ..launch import run_workers

        metrics = run_workers(config, output_dir=args.output, resume=args.resume, progress=progress,
                              force_config=args.force_config)
    else:
        from ..run.rollout import Rollout

        rollout = Rollout(config, output_dir=args.output, resume=args.resume, progress=progress,
                          force_config=args.force_config)
        print(f"scaffold: writing to {rollout.dir}", file=sys.stderr)
        on_head = None
        if not args.no_report:  # the report's counts, taken as the run's files are exported
            from ..report.episodes import Stats

            stats = report_options["stats"] = Stats()
            on_head = partial(_count_head, stats)
        metrics = rollout.run(on_head)
        if getattr(rollout.components.engine, "tokenizer", None) is not None:
            report_options["tokenizer"] = rollout.components.engine.tokenizer
    print_summary(metrics, as_json=args.json)
    if not args.no_report and metrics.get("output_dir"):
        from ..report.build import report_at_end

        report_at_end(metrics["output_dir"], **report_options)
    limit = config.rollout.max_failed_fraction
    code = exit_code_for(metrics, limit)
    reason = exit_reason(code, metrics, limit)
    if reason:
        print(reason, file=sys.stderr)
    return code


def cmd_train(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..plugins import get_registry
    from ..train.session import require_trainer, run_training, train_output_dir

    config = load_config(args.config, args.overrides)  # validates the trainer section before anything loads
    require_trainer(config, get_registry())
    overwrite = args.overwrite or config.output.overwrite
    if args.resume and overwrite:
        raise ConfigError("--resume continues the run in the directory and --overwrite replaces it: pass one")
    if args.force_config and not args.resume:
        raise ConfigError("--force-config only applies with --resume")
    output_dir = train_output_dir(config, args.output)
    print(f"scaffold: {'resuming' if args.resume else 'training into'} {output_dir}", file=sys.stderr)
    with contextlib.redirect_stdout(sys.stderr):  # what trainer libraries print; stdout is the summary's
        summary = run_training(config, output_dir, progress=False if args.no_progress else None,
                               overwrite=overwrite, resume=args.resume, force_config=args.force_config)
    print(json.dumps(summary, indent=2, default=str) if args.json else format_train_summary(summary, output_dir))
    if not args.no_report:
        from ..report.build import report_at_end

        report_at_end(output_dir)
    return ExitCode.OK


def cmd_eval(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..eval.command import format_table, run_eval
    from ..eval.figures import Bootstrap, parse_ks
    from ..run.metrics import truncation_warning, unscored_warning
    from ..run.summary import failure_report

    try:
        ks = parse_ks(args.k)
        bootstrap = Bootstrap(resamples=args.bootstrap)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"rollout.workers={args.workers}")
    if args.overwrite:
        overrides.append("output.overwrite=true")
    config = load_config(args.config, overrides)  # validates everything before any model loads
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
        from ..report.build import report_at_end

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
    from ..report.build import build_report

    if len(args.run_dir) > 1:
        return _compare(args)
    options: dict = {}
    if args.tokenizer:
        from ..report.tokens import load_tokenizer

        options["tokenizer"] = load_tokenizer(args.tokenizer)
    if args.max_episodes is not None and args.max_episodes < 0:
        raise ConfigError(f"--max-episodes: {args.max_episodes} is not >= 0")
    if args.max_episodes is not None:  # asked for: carried whatever their size
        options.update(max_episodes=args.max_episodes, budget=sys.maxsize)
    path = build_report(args.run_dir[0], output=args.output, **options)
    print(path)
    return ExitCode.OK


def _compare(args: argparse.Namespace) -> int:
    from ..report.compare import build_comparison

    for flag, value in (("--max-episodes", args.max_episodes), ("--tokenizer", args.tokenizer)):
        if value is not None:
            raise ConfigError(f"{flag} applies to the report of one directory; a comparison carries no "
                              "trajectories: leave it out")
    print(build_comparison(args.run_dir, output=args.output))
    return ExitCode.OK


def cmd_score(args: argparse.Namespace) -> int:
    from ..run.score import score_file

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


def cmd_new_plugin(args: argparse.Namespace) -> int:
    target = create_plugin(args.name, kind=args.kind, parent=args.dir)
    print(next_steps(target, args.name, args.kind))
    return ExitCode.OK
