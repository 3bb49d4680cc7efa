"""The ``scaffold`` command line: its parser and one function per command.

Heavier imports stay inside the commands so start-up is fast.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import io
import json
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from .._meta import CORE_DISTRIBUTION, PROJECT_NAME, version
from ..errors import ConfigError, ScaffoldError
from ..run.arguments import add_override_arguments, add_run_arguments, run_overrides
from ..run.summary import ExitCode, exit_code_for, exit_reason, format_train_summary, print_summary


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

    _plugin_commands(sub)
    return parser


def _plugin_commands(sub: argparse._SubParsersAction) -> None:
    """The commands installed plugins add through the ``register_commands`` hook."""
    from ..plugins import get_plugins

    for warning in get_plugins().add_commands(sub):
        print(f"warning: {warning}", file=sys.stderr)


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


def console() -> int:
    """The installed ``scaffold`` command: :func:`main`, then a quick end. The interpreter's own exit walks every
    object for reference cycles (some 400,000 once torch and transformers are loaded: about a second, a tenth of
    the multi-turn example). With no other thread left, what that exit does that matters is done here instead:
    files nobody closed are flushed (``type()``, not ``isinstance``: no object's ``__class__`` runs), exit
    functions run, output is flushed."""
    code = main()
    if threading.active_count() > 1:
        return code  # the interpreter waits for them
    writers = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)
    for obj in gc.get_objects():
        if issubclass(type(obj), writers) and not obj.closed:
            with contextlib.suppress(Exception):
                obj.flush()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


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


def run_reporter() -> Any:
    """What writes ``report.html`` at the end of ``run`` and ``train``: the first installed plugin's reporter (the
    ``run_reporter`` hook), or None, said once, when no plugin offers one."""
    from ..plugins import get_plugins

    reporter = get_plugins().pm.hook.run_reporter()
    if reporter is None:
        print("scaffold: no installed plugin writes reports (the run_reporter hook); report.html is not written "
              "(docs/plugins.md lists the package that does)", file=sys.stderr)
    return reporter


def cmd_run(args: argparse.Namespace) -> int:
    from ..config import load_config

    config = load_config(args.config, run_overrides(args))  # validates everything before any model loads
    progress = False if args.no_progress else None
    reporter = None if args.no_report else run_reporter()
    tokenizer = None
    if config.rollout.workers > 1 or config.rollout.launcher != "local":
        from ..launch import run_workers

        metrics = run_workers(config, output_dir=args.output, resume=args.resume, progress=progress,
                              force_config=args.force_config, on_head=getattr(reporter, "count", None))
    else:
        from ..run.rollout import Rollout

        rollout = Rollout(config, output_dir=args.output, resume=args.resume, progress=progress,
                          force_config=args.force_config)
        print(f"scaffold: writing to {rollout.dir}", file=sys.stderr)
        # The reporter counts each episode as the run exports its files (no second pass over a large run).
        metrics = rollout.run(getattr(reporter, "count", None))
        # The engine's tokenizer, when it ran in this process, gives the report its token texts.
        tokenizer = getattr(rollout.components.engine, "tokenizer", None)
    print_summary(metrics, as_json=args.json)
    if reporter is not None and metrics.get("output_dir"):
        reporter.write(metrics["output_dir"], tokenizer=tokenizer)
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
    reporter = None if args.no_report else run_reporter()
    if reporter is not None:
        reporter.write(output_dir)
    return ExitCode.OK
