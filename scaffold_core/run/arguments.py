"""The command-line arguments of a run, shared by ``scaffold run`` and the worker entry point."""

from __future__ import annotations

import argparse
from typing import Any


def add_override_arguments(parser: argparse.ArgumentParser, example: str) -> None:
    """``--set KEY=VALUE`` and ``--unset KEY`` (both repeatable, in order, into ``args.overrides``)."""
    from ..config import Unset  # the parser is built on every start: pydantic loads only when a config does

    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", type=_override,
                        help=f"override a key, e.g. --set {example} (repeatable); KEY=null removes it. "
                             "Setting SECTION.name to another component drops the previous one's options")
    parser.add_argument("--unset", dest="overrides", action="append", type=Unset, metavar="KEY",
                        help="remove a key or section, so its default applies (repeatable)")


def _override(text: str) -> str:
    """``--set``'s argument, checked as the command line is read: a malformed one is a usage error (exit 2)."""
    from ..config import parse_override
    from ..errors import ConfigError

    try:
        parse_override(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--set ")) from None
    return text


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The config file, its overrides, and where and how the run writes: ``-o``, ``--resume``, ``--overwrite``,
    ``--force-config``."""
    parser.add_argument("config", help="YAML config file")
    add_override_arguments(parser, "task.limit=4")
    parser.add_argument("-o", "--output", help="output directory (overrides output.dir)")
    parser.add_argument("--resume", action="store_true", help="continue a killed run in the output directory")
    parser.add_argument("--overwrite", action="store_true", help="replace a previous run in the output directory")
    parser.add_argument("--force-config", action="store_true",
                        help="with --resume: continue even though the config differs from the saved one (recorded "
                             "in config-history.jsonl)")


def run_overrides(args: argparse.Namespace) -> list[Any]:
    """The overrides a run's command line gives: ``--set``/``--unset`` (text, or a ``config.Unset``), then
    ``--workers`` and ``--overwrite``."""
    overrides = list(args.overrides)
    if getattr(args, "workers", None) is not None:
        overrides.append(f"rollout.workers={args.workers}")
    if getattr(args, "overwrite", False):
        overrides.append("output.overwrite=true")
    return overrides
