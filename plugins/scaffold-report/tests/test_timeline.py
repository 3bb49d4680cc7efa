"""Where the time went, shown: the report draws each episode's spans for run, eval and train directories and writes a
Chrome trace; `scaffold report A B` compares runs."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from scaffold_testkit.engines import ScriptedEngine
from scaffold_testkit.helpers import check_spans

from scaffold_core.cli import main
from scaffold_core.output.store import read_records
from scaffold_core.run.rollout import Rollout
from scaffold_report.build import build_report


def section(html: str, anchor: str) -> str:
    found = re.search(rf'<section id="{anchor}">.*?</section>', html, re.S)
    assert found, f"the page has no {anchor} section"
    return found.group(0)




def _timeline_checks(directory, html: str) -> None:
    time_section = section(html, "time")
    assert "share of episode time" in time_section
    assert '<svg class="chart wide gantt"' in time_section and 'class="span" data-phase=' in time_section
    assert "Spans in flight by phase" in time_section and '<polygon class="area"' in time_section
    assert '<a href="#time">Time</a>' in html
    trace = json.loads((directory / "trace.json").read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert slices and all(e["dur"] >= 0 and "episode_id" in e["args"] for e in slices)
    assert {e["cat"] for e in slices} >= {"episode"}


def test_the_timeline_keeps_every_span_named_or_not_and_leaves_out_a_malformed_episode():
    from scaffold_report.timeline import Timeline

    heads = [
        {"episode_id": "a", "started_s": 1.0, "wall_s": 2.0, "spans": [["generate", 1.0, 2.0], ["verify", 2.0, 2.5]]},
        {"episode_id": "b", "started_s": 0.5, "wall_s": 1.0,  # a phase not seen before, a named span, one before
         "spans": [["queued", 0.2, 0.5], ["tool", 0.6, 0.9, "search"], ["generate", 0.9, 1.2]]},
        {"episode_id": "c", "started_s": 3.0, "wall_s": 1.0, "spans": [["generate", 3.0, None]]},  # malformed
        {"episode_id": "d", "started_s": 4.0, "wall_s": 1.0, "spans": []},
        {"episode_id": "e", "started_s": 5.0, "wall_s": 1.0, "spans": [["tool", 5.0, 5.5, "search"]]},
    ]
    timeline = Timeline()
    for head in heads:
        timeline.add(head)
    assert len(timeline) == 4
    kept = timeline.first_to_start()
    assert [(e.id, e.began, e.ended) for e in kept] == [("b", 0.2, 1.5), ("a", 1.0, 3.0), ("d", 4.0, 5.0),
                                                        ("e", 5.0, 6.0)]
    assert kept[1].spans == [("generate", 1.0, 2.0, ""), ("verify", 2.0, 2.5, "")]
    assert kept[0].spans == [("queued", 0.2, 0.5, ""), ("tool", 0.6, 0.9, "search"), ("generate", 0.9, 1.2, "")]
    assert kept[2].spans == [] and kept[3].spans == [("tool", 5.0, 5.5, "search")]
    assert [e.id for e in timeline.chosen()] == ["b", "a", "d", "e"]  # a small run: every episode drawn


def _random_heads(count: int, seed: int = 0) -> list[dict]:
    """Episodes one after another, some queued first, some with a tool call overlapping their generation."""
    import random

    rng = random.Random(seed)
    heads, t = [], 0.0
    for i in range(count):
        t += rng.random() * 0.01
        at, spans = t, []
        if rng.random() < 0.5:
            spans.append(["queued", at, at + rng.random() * 0.01])
            at = spans[-1][2]
        spans.append(["generate", at, at + rng.random() * 0.05])
        at = spans[-1][2]
        if rng.random() < 0.1:
            spans.append(["tool", at - 0.01, at + 0.02, "search"])
        spans.append(["verify", at, at + 0.001])
        heads.append({"episode_id": f"e{i}", "started_s": t, "wall_s": at + 0.002 - t, "spans": spans})
    return heads


def test_the_timeline_figures_are_those_of_every_span_though_it_keeps_few(monkeypatch):
    """Folded a chunk at a time, the shares, the spans in flight, the slowest and the first to start are what
    every episode's spans give, while the episodes kept whole stay few."""
    import numpy as np

    from scaffold_core.spans import exclusive
    from scaffold_report import timeline as module

    monkeypatch.setattr(module, "CHUNK_EPISODES", 500)  # many folds, the cells doubling as the run goes on
    heads = _random_heads(6_000)
    timeline = module.Timeline(keep=25)
    for head in heads:
        timeline.add(head)

    extent = [(min(h["started_s"], *(s[1] for s in h["spans"])),
               max(h["started_s"] + h["wall_s"], *(s[2] for s in h["spans"]))) for h in heads]
    parts: dict[str, float] = {}
    for head, (began, ended) in zip(heads, extent):
        for phase, seconds in exclusive([tuple(s) for s in head["spans"]], began, ended).items():
            parts[phase] = parts.get(phase, 0.0) + seconds
    shares, total = timeline.shares()
    assert total == pytest.approx(sum(e - b for b, e in extent), rel=1e-9)
    assert shares == pytest.approx(parts, rel=1e-9) and set(shares) == {"queued", "generate", "tool", "verify",
                                                                          "other"}

    edges, series = timeline.in_flight()
    assert 60 <= len(edges) - 1 <= module.BINS and edges[0] <= extent[0][0] and edges[-1] >= max(e for _, e in extent)
    for phase in ("generate", "tool"):
        starts = np.array([s[1] for h in heads for s in h["spans"] if s[0] == phase])
        ends = np.array([s[2] for h in heads for s in h["spans"] if s[0] == phase])

        integral = [float(np.clip(t - starts, 0.0, ends - starts).sum()) for t in edges]
        expected = [(i1 - i0) / (b - a) for a, b, i0, i1 in zip(edges, edges[1:], integral, integral[1:])]
        assert series[phase] == pytest.approx(expected, abs=1e-6)

    took = [e - b for b, e in extent]
    assert [e.order for e in timeline.slowest()] == sorted(range(len(heads)), key=lambda i: -took[i])[:10]
    first = timeline.first_to_start()
    assert [e.order for e in first] == sorted(range(len(heads)), key=lambda i: extent[i][0])[:25]
    assert first[3].id == heads[first[3].order]["episode_id"] and first[3].spans[0][1] == extent[first[3].order][0]
    chosen = timeline.chosen()
    assert len(chosen) == module.GANTT_EPISODES and {e.order for e in timeline.slowest()} <= {e.order for e in chosen}
    assert chosen[-1].began > 0.8 * extent[-1][0]  # spread over the run, not only its start
    assert len(timeline._earliest) == 25 and len(timeline._slowest) == 10 and len(timeline.first) == 0


def test_the_timeline_memory_does_not_grow_with_the_run():
    import tracemalloc

    from scaffold_report.timeline import Timeline

    def grown(count: int) -> int:
        heads = _random_heads(count, seed=count)
        timeline = Timeline()
        tracemalloc.start()
        try:
            for head in heads:
                timeline.add(head)
            timeline.shares()
            return tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()

    small, large = grown(20_000), grown(80_000)
    assert large < small * 1.5 + 1_000_000, (small, large)  # it kept every span: about 4x


def test_the_run_report_draws_the_timeline_and_writes_a_trace(dice_plugins, dice_config, tmp_path):
    config = dice_config(task={"name": "sums", "count": 6}, controller={"name": "native", "samples": 2})
    Rollout(config, output_dir=tmp_path / "run", plugins=dice_plugins, progress=False).run()
    html = build_report(tmp_path / "run", tokenizer=None, registry=dice_plugins.registry).read_text()
    _timeline_checks(tmp_path / "run", html)
    gantt = re.search(r'<svg class="chart wide gantt".*?</svg>', html, re.S).group(0)
    assert gantt.count('<g class="lane"') == 6  # every episode when there are few
    assert gantt.count('data-phase="generate"') == 12 and 'data-phase="verify"' in gantt
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    episodes = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "episode"]
    assert len(episodes) == 6
    for episode in episodes:  # each span sits inside its episode's slice, on its row
        inner = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "episode"
                 and e["args"]["episode_id"] == episode["name"]]
        assert inner and all(e["tid"] == episode["tid"] for e in inner)
        assert all(episode["ts"] - 200 <= e["ts"] and e["ts"] + e["dur"] <= episode["ts"] + episode["dur"] + 200
                   for e in inner)


def test_the_trace_holds_the_first_episodes_to_start_as_many_as_asked(dice_plugins, dice_config, tmp_path,
                                                                       monkeypatch, capsys):
    config = dice_config(task={"name": "sums", "count": 6})
    Rollout(config, output_dir=tmp_path / "run", plugins=dice_plugins, progress=False).run()
    monkeypatch.setattr("scaffold_core.plugins.get_registry", lambda: dice_plugins.registry)

    def traced(*flags: str) -> list[dict]:
        (tmp_path / "run" / "trace.json").unlink(missing_ok=True)
        assert main(["report", str(tmp_path / "run"), *flags]) == 0
        if not (tmp_path / "run" / "trace.json").exists():
            return []
        trace = json.loads((tmp_path / "run" / "trace.json").read_text())
        return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "episode"]

    assert len(traced()) == 6  # the default holds a few thousand: all of these
    first = traced("--trace-episodes", "2")
    starts = sorted(r["started_s"] for r in read_records(tmp_path / "run"))
    assert [e["ts"] for e in first] == pytest.approx([s * 1e6 for s in starts[:2]], abs=2e3)
    assert traced("--trace-episodes", "0") == []
    assert "<code>trace.json</code>" not in (tmp_path / "run" / "report.html").read_text()  # not linked
    assert main(["report", str(tmp_path / "run"), "--trace-episodes", "-1"]) != 0
    assert "--trace-episodes: -1 is not >= 0" in capsys.readouterr().err


def test_the_eval_report_draws_the_timeline(eval_dir, dice_plugins, tmp_path):
    out = tmp_path / "r"
    shutil.copytree(eval_dir, out)
    html = build_report(out, tokenizer=ScriptedEngine().tokenizer, registry=dice_plugins.registry).read_text()
    _timeline_checks(out, html)


def test_the_train_report_draws_the_timeline(test_plugins, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("task: {name: arithmetic, count: 3}\nengine: {name: benchmark_canned, response: '42'}\n"
                      "trainer: {name: rollout_only, steps: 2, group: 2}\n")
    assert main(["train", str(config), "-o", str(tmp_path / "t"), "--no-progress"]) == 0
    html = (tmp_path / "t" / "report.html").read_text()
    _timeline_checks(tmp_path / "t", html)
    for record in read_records(tmp_path / "t"):
        check_spans(record)
    metrics = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert sum(metrics["time_shares"].values()) == pytest.approx(1.0, abs=1e-3)


# -- runs side by side ----------------------------------------------------------------------------------------


def test_two_runs_side_by_side(dice_plugins, dice_config, eval_dir, tmp_path):
    for name, samples in (("one", 1), ("two", 3)):
        config = dice_config(task={"name": "sums", "count": 6}, controller={"name": "native", "samples": samples})
        Rollout(config, output_dir=tmp_path / name, plugins=dice_plugins, progress=False).run()
    from scaffold_report.compare import build_comparison

    path = build_comparison([tmp_path / "one", tmp_path / "two", eval_dir], output=tmp_path / "c.html",
                            registry=dice_plugins.registry)
    html = path.read_text()
    runs = section(html, "summary")
    assert "<code>one</code>" in runs and "<code>two</code>" in runs and "<code>run</code>" in runs
    lengths = re.search(r"Generated tokens per sample.*?</svg>", html, re.S).group(0)
    assert lengths.count('<path class="line"') == 3 and ">one</text>" in lengths and ">two</text>" in lengths
    scaling = section(html, "scaling")  # the eval's pass@k; the plain runs have none
    assert "pass@k by k" in scaling and scaling.count('<path class="line"') == 2  # pass@k and majority@k
    timings = section(html, "time")
    assert "Share of episode time by phase" in timings and "one, generate:" in timings and "two, generate:" in timings


def test_compare_command_and_mixing_kinds(dice_plugins, dice_config, test_plugins, tmp_path, capsys):
    config = tmp_path / "train.yaml"
    config.write_text("task: {name: arithmetic, count: 2}\nengine: {name: benchmark_canned, response: '42'}\n"
                      "trainer: {name: rollout_only, steps: 2, group: 2}\n")
    for name in ("t1", "t2"):
        assert main(["train", str(config), "-o", str(tmp_path / name), "--no-progress", "--no-report"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "t1"), str(tmp_path / "t2"), "-o", str(tmp_path / "c.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "c.html")
    html = (tmp_path / "c.html").read_text()
    training = section(html, "training")
    assert "Reward" in training and ">t1</text>" in training and ">t2</text>" in training
    run = tmp_path / "run"
    Rollout(dice_config(task={"name": "sums", "count": 2}), output_dir=run, plugins=dice_plugins,
            progress=False).run()
    assert main(["report", str(tmp_path / "t1"), str(run), "-o", str(tmp_path / "bad.html")]) != 0
    err = capsys.readouterr().err
    assert "cannot compare training directories" in err and "Compare training directories together" in err
    assert not (tmp_path / "bad.html").exists()
    assert main(["report", str(tmp_path / "t1"), str(tmp_path / "t2"), "--max-episodes", "3"]) != 0
    assert "--max-episodes applies to the report of one directory" in capsys.readouterr().err


# -- OpenTelemetry ----------------------------------------------------------------------------------------------


