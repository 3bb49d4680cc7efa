"""``scaffold report A B [C ...]``: one offline page overlaying several runs, as TensorBoard and trackio do.

Each directory is read as for its own report (:func:`~.build.read_report`,
without the trajectory browser: every episode is counted, none carried) and
the page overlays them: one line or bar per run in every chart. What it
shows:

* a table of each run's headline figures (episodes, accuracy, reward, tokens,
  throughput, wall time, steps);
* training runs: every training chart of the single-run report, one line per
  run against the optimizer step;
* evals: pass@k and majority@k against k, one line per run;
* every run with episodes: the reward per sample and the generated tokens per
  sample (as the fraction of samples at or below each length);
* timings: each phase's share of the episodes' time (where they recorded
  spans), and tokens per second.

Runs and evals compare with each other (both are episodes with rewards); a
training directory compares only with training directories (its curves are
per optimizer step): mixing them is a RunDirError saying so.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from html import escape
from pathlib import Path
from typing import Any

from scaffold_core.errors import RunDirError
from scaffold_core.output.files import atomic_write_text

from ._versions import CORE_DISTRIBUTION, version
from .contents import Report
from .page import EVAL_NAMES, TRAIN_CHARTS, _is_number, _number, _table, asset, script_json
from .svg import PALETTE, Series, grouped_bar_chart, line_chart

#: Where the page goes when no ``-o`` is given (in the current directory).
COMPARE_FILE = "compare.html"
#: Points of each run's length curve.
CURVE_POINTS = 80


def labels_of(directories: list[Path]) -> list[str]:
    """A short, distinct label per directory: its name, else as much of its path as tells them apart."""
    paths = [Path(d).resolve() for d in directories]
    depth = 1
    while True:
        labels = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(labels)) == len(labels) or depth >= max(len(p.parts) for p in paths):
            return [label if labels.count(label) == 1 else f"{label} ({i + 1})" for i, label in enumerate(labels)]
        depth += 1


def check_kinds(reports: list[Report]) -> None:
    """Refuse a training directory beside run or eval directories (one is per step, the other per episode)."""
    kinds = {r.kind for r in reports}
    if "train" in kinds and len(kinds) > 1:
        trains = [str(r.directory) for r in reports if r.kind == "train"]
        others = [f"{r.directory} ({r.kind})" for r in reports if r.kind != "train"]
        raise RunDirError(f"cannot compare training directories ({', '.join(trains)}) with run or eval directories "
                          f"({', '.join(others)}): a training run's curves are per optimizer step, a run's figures "
                          "per episode. Compare training directories together, and runs and evals together",
                          path=trains[0])


def read_reports(directories: list[str | Path], registry: Any = None) -> list[Report]:
    from .build import read_report

    if len(directories) < 2:
        raise RunDirError("comparing runs needs at least two directories", path=str(directories[0]) if directories
                          else "")
    reports = [read_report(d, tokenizer=None, registry=registry, max_episodes=0) for d in directories]
    check_kinds(reports)
    return reports


# -- sections -----------------------------------------------------------------------------------------------


def _figures(reports: list[Report], labels: list[str]) -> str:
    head = ["run", "kind", "episodes", "failed", "accuracy", "mean reward", "tokens / sample", "tok/s", "wall s",
            "steps"]
    rows = []
    for i, (report, label) in enumerate(zip(reports, labels)):
        m = report.metrics or {}
        stats = report.stats
        mean_tokens = (sum(stats.tokens) / len(stats.tokens)) if stats is not None and stats.tokens else None
        swatch = f'<span class="swatch" style="background:{PALETTE[i % len(PALETTE)]}"></span>'
        rows.append([f"{swatch}<code>{escape(label)}</code>", escape(report.kind), _number(m.get("episodes")),
                     _number(m.get("failed")), _number(m.get("accuracy")), _number(m.get("reward_mean")),
                     _number(mean_tokens, 1), _number(m.get("tokens_per_s"), 1), _number(m.get("wall_s"), 1),
                     _number(len(report.steps)) if report.steps else "–"])
    paths = "".join(f"<li><code>{escape(label)}</code>: <code>{escape(str(r.directory))}</code></li>"
                    for r, label in zip(reports, labels))
    return (f'<section id="summary"><h2>Runs</h2>{_table(head, rows, "figures")}'
            f'<ul class="note">{paths}</ul></section>')


def _training(reports: list[Report], labels: list[str]) -> str:
    if not any(r.steps for r in reports):
        return ""
    charts = []
    for title, y_label, keys, _ in TRAIN_CHARTS:
        for key in keys:
            series = []
            for i, (report, label) in enumerate(zip(reports, labels)):
                pts = [(float(s["step"]), float(s[key])) for s in report.steps if _is_number(s.get(key))]
                if pts:
                    series.append(Series(label, pts, color=PALETTE[i % len(PALETTE)]))
            if series:
                steps = max(len(r.steps) for r in reports)
                charts.append(line_chart(series, title=f"{title}: {key}" if len(keys) > 1 else title,
                                         x_label="optimizer step", y_label=y_label, markers=steps <= 40,
                                         legend=True, integer_x=True))
    return f'<section id="training"><h2>Training</h2><div class="charts">{"".join(charts)}</div></section>'


def _scaling(reports: list[Report], labels: list[str]) -> str:
    evals = [(i, r.eval["by_k"], label) for i, (r, label) in enumerate(zip(reports, labels))
             if r.eval and r.eval.get("by_k")]
    if not evals:
        return ""
    charts = []
    for name in ("pass@k", "majority@k"):
        series = []
        for i, by_k, label in evals:
            rows = [row for row in by_k if isinstance(row.get(name), dict)]
            pts = [(float(row["k"]), float(row[name]["value"])) for row in rows if _is_number(row[name].get("value"))]
            band = [(float(row["k"]), float(row[name]["ci"][0]), float(row[name]["ci"][1])) for row in rows
                    if row[name].get("ci")]
            if pts:
                series.append(Series(label, pts, band, PALETTE[i % len(PALETTE)]))
        if series:
            ks = [x for s in series for x, _ in s.points]
            log_k = 2 if max(ks) / max(1.0, min(ks)) >= 4 else 0
            charts.append(line_chart(series, title=f"{EVAL_NAMES[name]} by k", x_label="k" + (" (log scale)" if log_k
                                     else ""), y_label="fraction of problems", log_x=log_k, y_range=(0.0, 1.0),
                                     legend=True))
    return f'<section id="scaling"><h2>Scaling</h2><div class="charts">{"".join(charts)}</div></section>'


def _cdf(values: Any, points: int = CURVE_POINTS) -> list[tuple[float, float]]:
    """(x, fraction of values at or below x) at about ``points`` places."""
    ordered = sorted(v for v in values if math.isfinite(v))
    if not ordered:
        return []
    n = len(ordered)
    picks = sorted({min(n - 1, round(i * (n - 1) / max(1, points - 1))) for i in range(points)})
    out: list[tuple[float, float]] = []
    for j in picks:
        x = float(ordered[j])
        while j + 1 < n and ordered[j + 1] == x:  # the last of equal values: the fraction at or below x
            j += 1
        if out and out[-1][0] == x:
            out[-1] = (x, (j + 1) / n)
        else:
            if out:  # a step: the fraction holds until the next value
                out.append((x, out[-1][1]))
            out.append((x, (j + 1) / n))
    return out


#: At most this many distinct rewards across the runs: bars per reward value instead of cumulative curves.
DISTINCT_REWARDS = 12


def _episodes(reports: list[Report], labels: list[str]) -> str:
    with_stats = [(i, r, label) for i, (r, label) in enumerate(zip(reports, labels)) if r.stats and r.stats.samples]
    if not with_stats:
        return ""
    tokens = [Series(label, _cdf(float(t) for t in r.stats.tokens), color=PALETTE[i % len(PALETTE)])
              for i, r, label in with_stats if r.stats is not None]
    charts = [line_chart(tokens, title="Generated tokens per sample", x_label="tokens",
                         y_label="fraction of samples at or below", y_range=(0.0, 1.0), markers=False, legend=True)]
    scored = [(i, r.stats.rewards, label) for i, r, label in with_stats if r.stats is not None and r.stats.rewards]
    distinct = sorted({v for _, rewards, _ in scored for v in rewards})
    if scored and len(distinct) <= DISTINCT_REWARDS:  # 0/1 rewards: the fraction of samples at each value
        shares = []
        for _, rewards, label in scored:
            counts = Counter(rewards)
            shares.append((label, [counts.get(v, 0) / len(rewards) for v in distinct]))
        charts.append(grouped_bar_chart([f"{v:g}" for v in distinct], shares, title="Reward per sample",
                                        x_label="reward", y_label="fraction of scored samples",
                                        value_format="{:.1%}"))
    elif scored:
        charts.append(line_chart([Series(label, _cdf(rewards), color=PALETTE[i % len(PALETTE)])
                                  for i, rewards, label in scored], title="Reward per sample", x_label="reward",
                                 y_label="fraction of samples at or below", y_range=(0.0, 1.0), markers=False,
                                 legend=True))
    finish = sorted({f for _, r, _ in with_stats if r.stats is not None for f in r.stats.finish})
    charts.append(grouped_bar_chart(
        finish, [(label, [r.stats.finish.get(f, 0) / r.stats.samples for f in finish])
                 for _, r, label in with_stats if r.stats is not None],
        title="Finish reasons", x_label="finish reason", y_label="fraction of samples", value_format="{:.1%}"))
    return f'<section id="rewards"><h2>Rewards and lengths</h2><div class="charts">{"".join(charts)}</div></section>'


def _timings(reports: list[Report], labels: list[str]) -> str:
    shares: list[tuple[str, dict[str, float]]] = []
    for report, label in zip(reports, labels):
        recorded = (report.metrics or {}).get("time_shares")
        if isinstance(recorded, dict) and recorded:
            shares.append((label, {str(k): float(v) for k, v in recorded.items()}))
        elif report.stats is not None and len(report.stats.timeline):
            parts, total = report.stats.timeline.shares()
            if total > 0:
                shares.append((label, {p: s / total for p, s in parts.items()}))
    charts = []
    if shares:
        from .timeline import _ordered_phases

        phases = _ordered_phases({p for _, s in shares for p in s})
        charts.append(grouped_bar_chart(phases, [(label, [s.get(p) for p in phases]) for label, s in shares],
                                        title="Share of episode time by phase", x_label="phase",
                                        y_label="share of episode time", value_format="{:.1%}"))
    speed = [(label, [float((r.metrics or {})["tokens_per_s"])]) for r, label in zip(reports, labels)
             if _is_number((r.metrics or {}).get("tokens_per_s"))]
    if speed:
        charts.append(grouped_bar_chart(["generated tokens per second"], speed, title="Throughput", x_label="",
                                        y_label="tokens / s", value_format="{:,.1f}"))
    if not charts:
        return ""
    return f'<section id="time"><h2>Timings</h2><div class="charts">{"".join(charts)}</div></section>'


SECTIONS = (("summary", "Runs"), ("training", "Training"), ("scaling", "Scaling"), ("rewards", "Rewards and lengths"),
            ("time", "Timings"))


def render_comparison(reports: list[Report], labels: list[str]) -> str:
    sections = [_figures(reports, labels), _training(reports, labels), _scaling(reports, labels),
                _episodes(reports, labels), _timings(reports, labels)]
    body = "".join(sections)
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in SECTIONS if f'<section id="{a}"' in body)
    title = "compare · " + " vs ".join(labels)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    kinds = sorted({r.kind for r in reports})
    badges = " ".join(f'<span class="badge badge-{escape(k)}">{escape(k)}</span>' for k in kinds)
    header = (f'<header><div class="brand">scaffold report</div><h1>{escape(title)}</h1>'
              f'<div class="meta">{badges} {len(reports)} runs · built {stamp} · {escape(CORE_DISTRIBUTION)} '
              f'{escape(version())}</div></header><nav class="top">{nav}</nav>')
    parts = {"TITLE": escape(f"scaffold report: {title}"), "CSS": asset("report.css"),
             "BODY": header + "<main>" + body + "</main>", "DATA": script_json({"episodes": [], "compare": labels}),
             "JS": asset("report.js")}
    return re.sub(r"\{\{(TITLE|CSS|BODY|DATA|JS)\}\}", lambda m: parts[m.group(1)], asset("report.html"))


def build_comparison(directories: list[str | Path], *, output: str | Path | None = None, registry: Any = None,
                     private: bool = True) -> Path:
    """Write one page comparing the runs in ``directories`` (default: ``compare.html`` here); returns its path."""
    if registry is None:
        from scaffold_core.plugins import get_registry

        registry = get_registry()
    reports = read_reports(directories, registry)
    labels = labels_of([r.directory for r in reports])
    target = Path(output) if output is not None else Path(COMPARE_FILE)
    atomic_write_text(target, render_comparison(reports, labels), private=private)
    return target
