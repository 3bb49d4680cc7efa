"""``scaffold report RUN_DIR``: one self-contained, offline ``report.html`` for a run, eval or train directory.

Everything is read through :mod:`scaffold_core.output.reader`; the page is
assembled by :mod:`.page` from the package's own CSS and JavaScript (no CDN,
no server: it opens from disk). Charts are inline SVG made here
(:mod:`.svg`); the trajectory browser is a few hundred lines of plain
JavaScript over one JSON block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaffold_core.output.files import atomic_write_text
from scaffold_core.output.reader import (
    EVAL_FILE,
    METRICS_FILE,
    PROVENANCE_FILE,
    REPORT_FILE,
    TRACE_FILE,
    TRAIN_SUMMARY,
    EpisodeReader,
    read_config,
    read_json,
    read_train_steps,
    run_kind,
)
from scaffold_core.output.store import store_paths

from .contents import Report
from .episodes import DETAIL_BYTES, MAX_EPISODES, Stats, Vocab, choose, episode_detail, scan
from .page import render
from .timeline import TRACE_EPISODES, write_trace
from .tokens import token_texts, tokenizer_for_run

_NO_TOKENIZER = object()


def read_report(directory: str | Path, *, tokenizer: Any = _NO_TOKENIZER, registry: Any = None,
                max_episodes: int = MAX_EPISODES, budget: int = DETAIL_BYTES, stats: Stats | None = None,
                trace_episodes: int = TRACE_EPISODES) -> Report:
    """Read what the report shows from ``directory`` (``tokenizer``: the run's, when the caller has it;
    ``stats``: every episode's head counted already, in order, by the run that wrote the directory as it
    exported its files; used when it counted as many episodes as the store holds and kept as many whole for
    the trace as ``trace_episodes``)."""
    root = Path(directory)
    report = Report(directory=root, kind=run_kind(root))
    saved = read_config(root)
    if saved is not None:
        report.config_text, report.config = saved
    report.metrics = read_json(root, METRICS_FILE)
    report.eval = read_json(root, EVAL_FILE)
    report.train_summary = read_json(root, TRAIN_SUMMARY)
    report.steps = read_train_steps(root)
    _versions(report, registry)
    if store_paths(root):
        _read_episodes(report, tokenizer, registry, max_episodes, budget, stats, trace_episodes)
    return report


def _versions(report: Report, registry: Any) -> None:
    report.provenance = read_json(report.directory, PROVENANCE_FILE) or {}
    recorded = report.provenance.get("versions") or (report.eval or {}).get("versions")
    if isinstance(recorded, dict):
        report.versions, report.versions_recorded = recorded, True
        return
    from scaffold_core.run.provenance import versions

    report.versions = versions(report.config, registry)


def _read_episodes(report: Report, tokenizer: Any, registry: Any, max_episodes: int, budget: int,
                   stats: Stats | None = None, trace_episodes: int = TRACE_EPISODES) -> None:
    with EpisodeReader(report.directory) as reader:
        if stats is None or stats.episodes != len(reader) or stats.timeline.keep < trace_episodes:
            stats = scan(reader.heads(), trace_episodes)  # not counted by the run, or too few kept for the trace
        report.stats = stats
        chosen = choose(stats.strata, max_episodes, budget)
        vocab = Vocab()
        report.episodes = [episode_detail(reader.record(position), vocab) for position in chosen]
    if tokenizer is _NO_TOKENIZER:
        tokenizer, report.tokens_from = tokenizer_for_run(report.config, registry)
    else:
        report.tokens_from = "the run's engine tokenizer" if tokenizer is not None else "no tokenizer given"
    texts = token_texts(tokenizer, vocab.ids)
    if vocab.ids and not texts:
        report.tokens_from = f"token ids only: {report.tokens_from}"
    report.vocab = vocab.table(texts)


def build_report(directory: str | Path, *, output: str | Path | None = None, tokenizer: Any = _NO_TOKENIZER,
                 registry: Any = None, max_episodes: int = MAX_EPISODES, budget: int = DETAIL_BYTES,
                 private: bool | None = None, stats: Stats | None = None,
                 trace_episodes: int = TRACE_EPISODES) -> Path:
    """Write ``report.html`` (or ``output``) for the run in ``directory``; returns its path.

    ``tokenizer``: the engine's tokenizer when the caller has it (the end of a run); otherwise one is found
    from the saved config (see :mod:`.tokens`). ``private``: the file's mode (default: the run's
    ``output.private``, else true). ``stats``: see :func:`read_report`. ``trace_episodes``: the episodes
    ``trace.json`` holds at most (the first to start; 0: no ``trace.json``).
    """
    if registry is None:
        from scaffold_core.plugins import get_registry

        registry = get_registry()
    report = read_report(directory, tokenizer=tokenizer, registry=registry, max_episodes=max_episodes,
                         budget=budget, stats=stats, trace_episodes=trace_episodes)
    target = Path(output) if output is not None else report.directory / REPORT_FILE
    if private is None:
        private = bool((report.config.get("output") or {}).get("private", True))
    timeline = report.stats.timeline if report.stats is not None else None
    if timeline is not None and len(timeline) and trace_episodes > 0:  # beside the page: Perfetto opens it
        report.trace = write_trace(timeline, target.with_name(TRACE_FILE), private=private,
                                   limit=trace_episodes).name
    html = render(report)
    atomic_write_text(target, html, private=private)
    return target


def report_at_end(directory: str | Path, *, tokenizer: Any = _NO_TOKENIZER, registry: Any = None,
                  stats: Stats | None = None) -> Path | None:
    """The report at the end of ``scaffold run``/``eval``/``train``: its path, or None with a warning when it
    could not be written (the run's own files are complete either way). ``stats``: see :func:`read_report`."""
    import sys

    try:
        path = build_report(directory, tokenizer=tokenizer, registry=registry, stats=stats)
    except Exception as exc:
        print(f"scaffold: WARNING: the report could not be written ({type(exc).__name__}: {exc}); write it later "
              f"with: scaffold report {directory}", file=sys.stderr)
        return None
    print(f"scaffold: report: {path}", file=sys.stderr)
    return path
