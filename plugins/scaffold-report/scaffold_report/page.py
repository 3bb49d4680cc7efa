"""The report page: its sections as HTML, the charts as SVG, and the browser's data as one JSON block.

The template, stylesheet and script are package files (``assets/``) inlined
here, so the page needs nothing but itself. Every text from the run (prompts,
responses, errors, config values) is escaped in HTML, and the JSON block is
written so no string in it can end the ``<script>`` element that holds it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from html import escape
from importlib import resources
from typing import Any

from scaffold_core.output.codec import dumps_compact

from ._versions import CORE_DISTRIBUTION, version
from .contents import Report
from .episodes import MAX_EPISODES, Stats
from .svg import PALETTE, Series, bar_chart, histogram_bins, line_chart
from .timeline import timeline_section

#: Sections of the page, in order: (anchor, title).
SECTIONS = (("summary", "Summary"), ("rewards", "Rewards"), ("scaling", "Scaling"), ("training", "Training"),
            ("time", "Time"), ("trajectories", "Trajectories"))
EVAL_NAMES = {"pass@k": "pass@k", "majority@k": "majority@k", "best_of_n@k": "best-of-N@k", "pass^k": "pass^k"}


def asset(name: str) -> str:
    return (resources.files(__package__) / "assets" / name).read_text(encoding="utf-8")


def script_json(data: Any) -> str:
    """``data`` as JSON safe inside a ``<script>`` element: no ``<`` appears raw (``</script>``, ``<!--``);
    a NaN or infinity becomes null (``JSON.parse`` accepts no other spelling)."""
    import orjson

    text = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS).decode("utf-8")
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _number(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        text = f"{value:,.{digits}f}" if abs(value) < 1e6 else f"{value:,.0f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return escape(str(value))


def _card(label: str, value: str, note: str = "", tone: str = "") -> str:
    cls = f"card {tone}".strip()
    sub = f'<div class="card-note">{escape(note)}</div>' if note else ""
    return (f'<div class="{cls}"><div class="card-label">{escape(label)}</div><div class="card-value">{value}</div>'
            f"{sub}</div>")


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """A table; cells are HTML already (escape what comes from the run before)."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


# -- summary ------------------------------------------------------------------------------------------------


def _exit_status(report: Report) -> tuple[str, str]:
    from scaffold_core.run.summary import ExitCode, exit_code_for

    metrics = report.metrics or {}
    if not metrics:
        return ("finished" if report.train_summary else "unknown", "")
    limit = float((report.config.get("rollout") or {}).get("max_failed_fraction", 0.5))
    code = exit_code_for(metrics, limit)
    tone = "good" if code == ExitCode.OK else "bad"
    return f"{code.name.lower().replace('_', ' ')} ({int(code)})", tone


def _cards(report: Report) -> str:
    m = report.metrics or {}
    cards = []
    status, tone = _exit_status(report)
    cards.append(_card("exit status", escape(status), tone=tone))
    if report.eval:
        first = report.eval["by_k"][0]
        last = report.eval["by_k"][-1]
        cards.append(_card(f"pass@{first['k']}", _fraction(first["pass@k"]["value"]), _ci(first["pass@k"])))
        if last is not first:
            cards.append(_card(f"pass@{last['k']}", _fraction(last["pass@k"]["value"]), _ci(last["pass@k"])))
            cards.append(_card(f"majority@{last['k']}", _fraction(last["majority@k"]["value"]),
                               _ci(last["majority@k"])))
        problems = report.eval.get("problems") or {}
        cards.append(_card("problems", _number(problems.get("evaluated")),
                           f"{report.eval.get('answers_per_problem', '?')} answers each"))
        kl = report.eval.get("teacher_kl")
        if isinstance(kl, dict) and _is_number(kl.get("value")):
            note = (f"nats per token, mean over {kl.get('answers', '?')} answers; largest "
                    f"{_number(kl.get('max_answer'), 3)}" + (f"; {_ci(kl)}" if kl.get("ci") else ""))
            cards.append(_card("teacher-student KL", f"{kl['value']:.3f}", note))
    elif m:
        cards.append(_card("accuracy", _fraction(m.get("accuracy")), "per completed episode"))
        cards.append(_card("mean reward", _fraction(m.get("reward_mean")), "per scored rollout"))
    if m:
        cards.append(_card("episodes", _number(m.get("episodes")),
                           f"{m.get('failed', 0):,} failed" if m.get("failed") else "none failed",
                           tone="bad" if m.get("failed") else ""))
        rollouts = m.get("rollouts")
        notes = [f"{m.get('unscored_samples', 0):,} unscored" if m.get("unscored_samples") else "",
                 f"from {rollouts:,} rollouts" if isinstance(rollouts, int) and rollouts != m.get("samples") else ""]
        cards.append(_card("samples", _number(m.get("samples")), "; ".join(n for n in notes if n)))
        if m.get("drift"):
            cards.append(_card("drift", _number(m.get("drift"), 2), "history rewrites per episode (the agent's client "
                               "changed what the model wrote; see docs/serve.md)", tone="bad"))
        cards.append(_card("generated tokens", _number(m.get("generated_tokens")),
                           f"{_number(m.get('tokens_per_s'), 1)} tok/s"))
        truncated = float(m.get("truncated_fraction") or 0.0)
        cards.append(_card("truncated", f"{truncated:.1%}", "stopped at max_tokens",
                           tone="bad" if truncated > 0.2 else ""))
    if report.train_summary:
        t = report.train_summary
        cards.append(_card("steps", _number(t.get("steps")), f"{_number(t.get('wall_s'), 1)} s"))
        if t.get("train_loss") is not None:
            cards.append(_card("train loss", _number(t.get("train_loss"))))
    return '<div class="cards">' + "".join(cards) + "</div>"


def _fraction(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "–"


def _ci(fig: dict[str, Any]) -> str:
    ci = fig.get("ci")
    return f"95% CI {ci[0]:.3f} – {ci[1]:.3f}" if ci else ""


def _components(report: Report) -> str:
    comps = (report.versions or {}).get("components") or {}
    rows = []
    for section in ("task", "controller", "engine", "verifier", "trajectory", "trainer"):
        body = report.config.get(section)
        if not isinstance(body, dict):
            continue
        info = comps.get(section) or {}
        options = ", ".join(f"{k}={_short(v)}" for k, v in body.items() if k != "name")
        dist = info.get("distribution") or "–"
        ver = info.get("version") or "–"
        rows.append([escape(section), f"<code>{escape(str(body.get('name')))}</code>", escape(dist), escape(ver),
                     f'<span class="options">{escape(options)}</span>'])
    if not rows:
        return ""
    libs = dict((report.versions or {}).get("libraries") or {})
    where = "recorded by the run" if report.versions_recorded else "installed where this report was built"
    libs_text = ", ".join(f"{k} {v}" for k, v in libs.items())
    core = (report.versions or {}).get(CORE_DISTRIBUTION, version())
    note = (f'<p class="note">Versions {where}: {escape(CORE_DISTRIBUTION)} {escape(str(core))}, Python '
            f'{escape(str((report.versions or {}).get("python", "?")))}; {escape(libs_text)}.</p>')
    return ("<h3>Components</h3>" + _table(["section", "name", "distribution", "version", "options"], rows)
            + note)


def _short(value: Any, limit: int = 60) -> str:
    text = dumps_compact(value).decode("utf-8") if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _failures(report: Report) -> str:
    causes = []
    if report.stats is not None and report.stats.failures:
        causes = [(comp, err, n) for (comp, err), n in report.stats.failures.most_common(8)]
    elif report.metrics and report.metrics.get("top_failure_causes"):
        causes = [(c["component"], c["error"], c["count"]) for c in report.metrics["top_failure_causes"]]
    if not causes:
        return ""
    rows = [[f"{n:,}", f"<code>{escape(str(comp))}</code>", f'<span class="error-text">{escape(str(err))}</span>']
            for comp, err, n in causes]
    return "<h3>Failure causes</h3>" + _table(["episodes", "component", "first line of the error"], rows)


def summary_section(report: Report) -> str:
    config = (f'<details class="config"><summary>Resolved config (config.yaml)</summary><pre>'
              f"{escape(report.config_text)}</pre></details>") if report.config_text else ""
    return (f'<section id="summary"><h2>Summary</h2>{_provenance(report)}{_cards(report)}{_components(report)}'
            f"{_failures(report)}{config}</section>")


def _provenance(report: Report) -> str:
    """One line of what produced the run: model, weights, tokenizer, engine, seed, scaffold (``provenance.json``)."""
    p = report.provenance
    if not p:
        return ""
    model, engine = p.get("model") or {}, p.get("engine") or {}
    weights = model.get("weights") or {}
    parts = [("model", str(model.get("name")) + (f"@{model['revision']}" if model.get("revision") else "")),
             ("weights", f"{weights['fingerprint']} ({_number(weights.get('bytes'))} bytes)" if weights else
              "not a local file"),
             ("tokenizer", str(model.get("tokenizer"))),
             ("engine", f"{engine.get('name')} " + " ".join(f"{k}={_short(v, 40)}" for k, v in
                                                               (engine.get("options") or {}).items())),
             ("seed", str(p.get("seed"))),
             (CORE_DISTRIBUTION, str((p.get("versions") or {}).get(CORE_DISTRIBUTION)))]
    items = "".join(f"<span><b>{escape(k)}</b> <code>{escape(v.strip())}</code></span>" for k, v in parts)
    return f'<div class="provenance" title="provenance.json">{items}</div>'



# -- rewards ------------------------------------------------------------------------------------------------


def rewards_section(report: Report) -> str:
    stats = report.stats
    if stats is None or not stats.samples:
        return ""
    charts = []
    labels, counts, tips, edges = histogram_bins(stats.rewards)
    if counts:
        low, high = min(0.0, edges[0]), max(1.0, max(stats.rewards))  # 0 wrong (vermillion) .. 1 right (green)
        colors = [_mix(PALETTE[1], PALETTE[2], (edge - low) / (high - low)) for edge in edges]
        charts.append(bar_chart(labels, counts, tips=tips, colors=colors, title="Reward per sample",
                                x_label="reward", y_label="samples"))
    solved = _solve_rate(stats)
    if solved:
        charts.append(solved)
    finish = stats.finish.most_common()
    colors = [PALETTE[1] if name == "length" else PALETTE[2] if name == "stop" else PALETTE[4] for name, _ in finish]
    charts.append(bar_chart([f for f, _ in finish], [c for _, c in finish], colors=colors, title="Finish reasons",
                            x_label="finish reason", y_label="samples",
                            tips=[f"{f}: {c:,} ({c / stats.samples:.1%})" for f, c in finish]))
    labels, counts, tips, _ = histogram_bins([float(t) for t in stats.tokens], 24, distinct_max=1)
    if counts:
        charts.append(bar_chart(labels, counts, tips=tips, title="Generated tokens per sample",
                                x_label="tokens (bin start)", y_label="samples", colors=[PALETTE[5]] * len(counts)))
    unscored = (f'<p class="note">{stats.unscored:,} of {stats.samples:,} samples have no reward (not verified, or '
                "the verifier could not score them); they are left out of the reward charts, never counted as 0.</p>"
                if stats.unscored else "")
    return (f'<section id="rewards"><h2>Rewards</h2><div class="charts">{"".join(charts)}</div>{unscored}'
            "</section>")


def _solve_rate(stats: Stats) -> str:
    """How many of each problem's answers are correct: bars of c/n when every problem has the same n."""
    if not stats.solved or max(n for _, n in stats.solved) < 2:
        return ""
    sizes = {n for _, n in stats.solved}
    if len(sizes) == 1:
        n = sizes.pop()
        labels = [f"{c}/{n}" for c in range(n + 1)]
        counts = [stats.solved.get((c, n), 0) for c in range(n + 1)]
    else:
        labels = [f"{b / 10:.1f}" for b in range(11)]
        counts = [0] * 11
        for (c, n), many in stats.solved.items():
            counts[round(10 * c / n)] += many
    total = sum(counts)
    tips = [f"{label} correct: {c:,} problems ({c / total:.1%})" for label, c in zip(labels, counts)]
    colors = [_mix(PALETTE[1], PALETTE[2], i / max(1, len(counts) - 1)) for i in range(len(counts))]
    return bar_chart(labels, counts, tips=tips, colors=colors, title="Correct answers per problem",
                     x_label="answers correct", y_label="problems")


def _mix(a: str, b: str, t: float) -> str:
    ra, ga, ba = (int(a[i:i + 2], 16) for i in (1, 3, 5))
    rb, gb, bb = (int(b[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in ((ra, rb), (ga, gb), (ba, bb)))


# -- eval ---------------------------------------------------------------------------------------------------


def scaling_section(report: Report) -> str:
    ev = report.eval
    if not ev or not ev.get("by_k"):
        return ""
    rows = ev["by_k"]
    names = [n for n in ev.get("metrics") or EVAL_NAMES if n in rows[0]]
    labels = dict(EVAL_NAMES)
    plotted = list(names)
    if "best_of_n@k" in names and all(r["best_of_n@k"]["value"] == r["pass@k"]["value"] for r in rows):
        # picked by the run's own verifier, best-of-N is pass@k (an oracle): one line for both
        labels["pass@k"] = f"pass@k (= best-of-N@k by {ev.get('select', 'reward')})"
        plotted.remove("best_of_n@k")
    vs_k, vs_tokens = [], []
    for i, name in enumerate(plotted):
        color = PALETTE[i % len(PALETTE)]
        pts = [(r["k"], r[name]["value"]) for r in rows if r[name]["value"] is not None]
        band = [(r["k"], *r[name]["ci"]) for r in rows if r[name].get("ci")]
        tips = [f"{EVAL_NAMES.get(name, name)} at k={r['k']}: {r[name]['value']:.3f}"
                + (f"  [{r[name]['ci'][0]:.3f}, {r[name]['ci'][1]:.3f}]" if r[name].get("ci") else "")
                for r in rows if r[name]["value"] is not None]
        dashed = name == "pass^k"
        vs_k.append(Series(labels.get(name, name), pts, band, color, dashed, tips))
        tok = {r["k"]: r["tokens_per_problem"]["value"] for r in rows}
        vs_tokens.append(Series(labels.get(name, name), [(tok[k], y) for k, y in pts if tok.get(k)],
                                [(tok[b[0]], b[1], b[2]) for b in band if tok.get(b[0])], color, dashed,
                                [f"{t}  ({tok[k]:,.0f} tokens/problem)" for (k, _), t in zip(pts, tips)]))
    ks = [r["k"] for r in rows]
    log_k = 2 if len(ks) > 1 and max(ks) / max(1, min(ks)) >= 4 else 0
    charts = [line_chart(vs_k, title="Scaling with k (answers per problem)", x_label="k" + (" (log scale)" if log_k
                         else ""), y_label="fraction of problems", log_x=log_k, y_range=(0.0, 1.0)),
              line_chart(vs_tokens, title="Scaling with tokens spent", x_label="generated tokens per problem"
                         + (" (log scale)" if log_k else ""), y_label="fraction of problems",
                         log_x=10 if log_k else 0, y_range=(0.0, 1.0))]
    head = ["k", "problems", *[EVAL_NAMES.get(n, n) for n in names], "tokens / problem"]
    body = [[str(r["k"]), f"{r['problems']:,}", *[_fig(r[n]) for n in names],
             _number(r["tokens_per_problem"]["value"], 0)] for r in rows]
    note = (f'<p class="note">Each figure is the mean over problems of an unbiased estimate from '
            f"{ev.get('answers_per_problem', max(ks))} answers per problem, with a {ev['bootstrap']['confidence']:.0%}"
            f" bootstrap interval over problems ({ev['bootstrap']['resamples']:,} resamples). Best-of-N picks by "
            f"<code>{escape(str(ev.get('select')))}</code>. Ties: {escape(str(ev.get('ties', '')))}.</p>")
    return (f'<section id="scaling"><h2>Scaling</h2><div class="charts">{"".join(charts)}</div>'
            f"{_table(head, body, 'figures')}{note}</section>")


def _fig(fig: dict[str, Any]) -> str:
    if fig.get("value") is None:
        return "–"
    ci = fig.get("ci")
    return f"<b>{fig['value']:.3f}</b>" + (f' <span class="ci">[{ci[0]:.3f}, {ci[1]:.3f}]</span>' if ci else "")


# -- training -----------------------------------------------------------------------------------------------

TRAIN_CHARTS = (
    ("Reward", "reward", ("reward_mean",), "reward_std"),
    ("Loss", "loss", ("loss",), None),
    ("Entropy", "entropy (nats)", ("entropy",), None),
    ("Staleness", "samples", ("stale_dropped", "stale_regenerated"), None),
    ("Weight version", "version", ("version",), None),
    ("Gradient norm", "norm", ("grad_norm",), None),
    ("Prompt groups", "groups", ("groups_used", "groups_filtered"), None),
    ("Learning rate", "learning rate", ("learning_rate",), None),
    ("Completion length", "tokens (mean)", ("completion_length",), None),
    ("Clip ratio", "fraction of tokens", ("clip_ratio",), None),
    ("KL", "KL (nats)", ("kl", "teacher_kl"), None),
    ("Step time", "seconds", ("step_time_s", "rollout_s"), None),
    ("Teacher-student KL", "nats per token", ("teacher_kl", "teacher_kl_max_sample"), None),
)
#: Charts of on-policy distillation only: not listed as missing in other runs.
OPTIONAL_CHARTS = ("teacher_kl",)


def training_section(report: Report) -> str:
    steps = report.steps
    if not steps:
        return ""
    charts: list[str] = []
    # a mean ± std band never goes past the rewards the run gave (no band below 0 for 0/1 rewards)
    seen = report.stats.rewards if report.stats is not None and report.stats.rewards else None
    low, high = (min(seen), max(seen)) if seen else (-math.inf, math.inf)
    for title, y_label, keys, spread in TRAIN_CHARTS:
        series = []
        for i, key in enumerate(keys):
            pts = [(float(s["step"]), float(s[key])) for s in steps if _is_number(s.get(key))]
            if not pts:
                continue
            band = []
            if spread:
                band = [(float(s["step"]), max(low, float(s[key]) - float(s[spread])),
                         min(high, float(s[key]) + float(s[spread])))
                        for s in steps if _is_number(s.get(key)) and _is_number(s.get(spread))]
            series.append(Series(key, pts, band, PALETTE[(len(charts) + i) % len(PALETTE)]))
        if series:
            suffix = " (± reward_std)" if spread and series[0].band else ""
            charts.append(line_chart(series, title=title + suffix, x_label="optimizer step", y_label=y_label,
                                     markers=len(steps) <= 40, legend=True, integer_x=True))
    missing = [k for _, _, keys, _ in TRAIN_CHARTS for k in keys[:1]
               if k not in OPTIONAL_CHARTS and not any(_is_number(s.get(k)) for s in steps)]
    note = (f'<p class="note">Not reported by this trainer: {escape(", ".join(missing))}.</p>' if missing else "")
    return (f'<section id="training"><h2>Training</h2><p class="note">{len(steps):,} optimizer steps from '
            f'train_metrics.jsonl.</p><div class="charts">{"".join(charts)}</div>{note}</section>')


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- trajectories -------------------------------------------------------------------------------------------


def trajectories_section(report: Report) -> str:
    stats = report.stats
    if stats is None:
        note = ("This run directory has no episode store (a training run keeps its rollouts in the trainer); "
                "there are no trajectories to browse.") if report.kind == "train" else "No episodes were recorded."
        return f'<section id="trajectories"><h2>Trajectories</h2><p class="note">{note}</p></section>'
    shown = len(report.episodes)
    if shown < stats.episodes:
        sampled = (f"Showing <b>{shown:,}</b> of {stats.episodes:,} episodes: a stratified random sample (by status "
                   "and by how many answers were right, seeded), because the browser carries at most "
                   f"{MAX_EPISODES:,} episodes or about 6 MB of tokens. Every chart and figure above uses all "
                   "episodes; <code>scaffold report DIR --max-episodes N</code> carries more.")
    else:
        sampled = f"All {stats.episodes:,} episodes."
    tokens = f" Token texts: {escape(report.tokens_from)}." if report.tokens_from else ""
    train = report.kind == "train"
    ids = ('<p class="note">Episode ids of a training run read <code>s&lt;step&gt;/r&lt;round&gt;.&lt;slot&gt;/'
           "&lt;row id&gt;/&lt;n&gt;</code>: the optimizer step, the refill round and the slot of the prompt in "
           "it, the dataset row's id (together: the GRPO group), and the sample's number in its group (a "
           "trailing <code>rN</code>: a retried attempt). Each sample shows its step, group, advantage, and "
           "whether the trainer used it or left it out (a group whose rewards were all equal, or a sample cut "
           "from a group).</p>") if train else ""
    step_filter = ('<label>step <select id="f-step"></select></label>'
                   '<label>training <select id="f-used"></select></label>') if train else ""
    return f"""<section id="trajectories"><h2>Trajectories</h2>
<p class="note">{sampled}{tokens}</p>{ids}
<div class="browser">
  <div class="filters" id="filters">
    {step_filter}<label>reward <select id="f-reward"></select></label>
    <label>status <select id="f-status"></select></label>
    <label>finish <select id="f-finish"></select></label>
    <label>branch <select id="f-branch"></select></label>
    <label class="grow">search <input id="f-search" type="search" placeholder="id, answer or text"></label>
    <span class="count" id="f-count"></span>
  </div>
  <div class="panes">
    <div class="list" id="list" role="listbox" tabindex="0" aria-label="trajectories"></div>
    <div class="detail" id="detail"><p class="note">Select a trajectory on the left (keys: j / k).</p></div>
  </div>
</div>
<div id="tip" class="tip" hidden></div>
</section>"""


def time_section(report: Report) -> str:
    """Where the episodes' time went (see :mod:`.timeline`)."""
    timeline = report.stats.timeline if report.stats is not None else None
    return timeline_section(timeline, report.metrics, report.trace)


def render(report: Report) -> str:
    """The whole page."""
    from .timeline import PHASE_COLORS

    sections = [summary_section(report), rewards_section(report), scaling_section(report),
                training_section(report), time_section(report), trajectories_section(report)]
    present = {anchor for anchor, _ in SECTIONS if f'<section id="{anchor}"' in "".join(sections)}
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in SECTIONS if a in present)
    data = {"episodes": report.episodes, "vocab": report.vocab, "kind": report.kind, "phases": PHASE_COLORS}
    title = f"{report.kind} · {report.directory.name or report.directory}"
    stamp = time.strftime("%Y-%m-%d %H:%M")
    header = (f'<header><div class="brand">scaffold report</div><h1>{escape(title)}</h1>'
              f'<div class="meta"><span class="badge badge-{escape(report.kind)}">{escape(report.kind)}</span> '
              f"<code>{escape(str(report.directory))}</code> · built {stamp} · {escape(CORE_DISTRIBUTION)} "
              f'{escape(version())}</div></header><nav class="top">{nav}</nav>')
    parts = {"TITLE": escape(f"scaffold report: {title}"), "CSS": asset("report.css"),
             "BODY": header + "<main>" + "".join(sections) + "</main>", "DATA": script_json(data),
             "JS": asset("report.js")}
    # one pass over the template: text from the run can never be taken for a placeholder
    return re.sub(r"\{\{(TITLE|CSS|BODY|DATA|JS)\}\}", lambda m: parts[m.group(1)], asset("report.html"))
