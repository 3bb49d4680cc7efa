"""`scaffold report`: one offline page for run, eval and train directories; hostile text stays text; big runs
are sampled, and the page says so."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from scaffold_testkit.engines import ScriptedEngine

from scaffold_core.cli import main
from scaffold_core.errors import RunDirError
from scaffold_core.output.reader import EpisodeReader, read_json, read_train_steps, run_kind
from scaffold_core.run.rollout import Rollout
from scaffold_report.build import build_report, read_report


def page_data(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert found, "the page has no data block"
    return json.loads(found.group(1))


def test_eval_report_is_one_offline_page_with_charts_and_the_browser(eval_dir, dice_plugins, tmp_path):
    out = tmp_path / "r"
    shutil.copytree(eval_dir, out)
    path = build_report(out, tokenizer=ScriptedEngine().tokenizer, registry=dice_plugins.registry)
    assert path == out / "report.html"
    html = path.read_text(encoding="utf-8")
    # nothing outside the file: no remote scripts, styles, images or fonts
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "<link" not in html
    for section in ("summary", "rewards", "scaling", "trajectories"):
        assert f'<section id="{section}">' in html
    assert html.count("<svg") >= 6  # reward, solve rate, finish, tokens, and the two scaling curves
    assert "Scaling with k" in html and "Scaling with tokens spent" in html
    data = page_data(html)
    assert len(data["episodes"]) == 12 and all(len(e["s"]) == 4 for e in data["episodes"])
    sample = data["episodes"][0]["s"][0]
    assert len(sample["t"]) == len(sample["lp"]) == sample["m"][1]  # one run of loss mask 1 over the output
    assert all(isinstance(data["vocab"][str(i)], str) for i in sample["t"])  # every token's text
    assert "".join(data["vocab"][str(i)] for i in sample["t"]).startswith(sample["x"] or "")


def test_text_from_the_run_cannot_end_the_script_or_inject_markup(eval_dir, dice_plugins, tmp_path):
    out = tmp_path / "r"  # the scripted model writes HOSTILE (scaffold_testkit.dice) into some answers
    shutil.copytree(eval_dir, out)
    html = build_report(out, tokenizer=ScriptedEngine().tokenizer, registry=dice_plugins.registry).read_text()
    assert "window.hacked" in html  # the hostile answers are in the page ...
    assert "</script><script>window.hacked" not in html  # ... never as markup
    assert "<img src=x" not in html
    assert html.count("</script>") == 2  # the data block's and the script's own
    assert "{{JS}}" in html  # a placeholder inside the data stays text; the template is filled once


def test_run_report_counts_every_episode_and_samples_the_browser_past_the_bound(dice_plugins, dice_config,
                                                                                tmp_path):
    config = dice_config(task={"name": "sums", "count": 40}, controller={"name": "native", "samples": 2})
    Rollout(config, output_dir=tmp_path / "run", plugins=dice_plugins, progress=False).run()
    assert run_kind(tmp_path / "run") == "run"
    path = build_report(tmp_path / "run", tokenizer=None, registry=dice_plugins.registry, max_episodes=10)
    html = path.read_text()
    data = page_data(html)
    assert len(data["episodes"]) == 10
    assert "Showing <b>10</b> of 40 episodes" in html and "stratified random sample" in html
    assert "Token texts: token ids only" in html
    assert data["vocab"] == {}  # no tokenizer: ids are shown, and the page says so
    assert '<section id="scaling">' not in html  # a plain run has no eval figures
    # the charts count all 40 episodes' 80 samples, not the 10 carried
    bars = re.search(r"Reward per sample.*?</svg>", html, re.S).group(0)
    counts = [int(c.replace(",", "")) for c in re.findall(r"<title>[^<]*?: ([\d,]+)</title>", bars)]
    assert sum(counts) + json.loads((tmp_path / "run" / "metrics.json").read_text())["unscored_samples"] == 80


def test_a_stratified_sample_keeps_rare_failures(tmp_path):
    from scaffold_report.episodes import choose

    strata = [(i, "none", 1000) for i in range(990)] + [(990 + i, "failed", 500) for i in range(10)]
    chosen = choose(strata, max_episodes=100)
    assert len(chosen) == 100 and chosen == sorted(chosen)
    assert sum(1 for p in chosen if p >= 990) >= 6
    assert choose(strata, max_episodes=100) == chosen  # seeded
    assert len(choose(strata, max_episodes=10_000, budget=50_000)) == 50  # the byte budget binds first


def test_failed_episodes_show_their_causes(dice_plugins, dice_config, tmp_path):
    config = dice_config(task={"name": "sums", "count": 4}, rollout={"max_failed_fraction": 1.0})
    rollout = Rollout(config, output_dir=tmp_path / "run", plugins=dice_plugins, progress=False)
    rollout.components.engine.fail = lambda prompt: "11 +" in prompt or "12 +" in prompt
    rollout.run()
    html = build_report(tmp_path / "run", tokenizer=None, registry=dice_plugins.registry).read_text()
    assert "Failure causes" in html and "injected engine failure" in html
    statuses = [e["st"] for e in page_data(html)["episodes"]]
    assert statuses.count("failed") == 2 and statuses.count("ok") == 2


def test_train_report_plots_each_step(test_plugins, tmp_path, capsys):
    config = tmp_path / "train.yaml"
    config.write_text("task: {name: arithmetic, count: 3}\nengine: {name: benchmark_canned, response: '42'}\n"
                      "trainer: {name: rollout_only, steps: 3, group: 2}\n")
    assert main(["train", str(config), "-o", str(tmp_path / "t"), "--no-progress"]) == 0
    assert run_kind(tmp_path / "t") == "train"
    assert [s["step"] for s in read_train_steps(tmp_path / "t")] == [1, 2, 3]
    html = (tmp_path / "t" / "report.html").read_text()
    assert '<section id="training">' in html and "3 optimizer steps" in html
    assert "Reward" in html and "Weight version" in html and "Staleness" in html
    assert "Not reported by this trainer: loss, entropy" in html  # rollout_only trains nothing
    assert "no episode ledger" not in html  # the training run's rollouts are in its ledger: browsable
    assert len(page_data(html)["episodes"]) == 3 * 3 * 2  # steps x rows x samples (one episode each)
    # each sample carries its step, GRPO group, advantage and whether it was trained on; the ids are explained
    sample = page_data(html)["episodes"][-1]["s"][0]
    assert sample["st"] == 3 and sample["gid"].startswith("s3/") and "adv" in sample and sample["u"] in (True, False)
    assert 'id="f-step"' in html and 'id="f-used"' in html and "the refill round and the slot" in html
    training = re.search(r'<section id="training">.*?</section>', html, re.S).group(0)
    x_ticks = re.findall(r'<text class="tick" x="[\d.]+" y="[\d.]+" text-anchor="middle">([^<]+)</text>', training)
    assert x_ticks and all(t.isdigit() for t in x_ticks)  # optimizer steps are whole: no tick at 1.5


def test_report_command_and_its_errors(eval_dir, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(eval_dir, out)
    assert main(["report", str(out), "-o", str(tmp_path / "page.html"), "--max-episodes", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "page.html")
    assert len(page_data((tmp_path / "page.html").read_text())["episodes"]) == 3
    assert main(["report", str(tmp_path / "missing")]) == 1
    assert "no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match="not a run directory"):
        run_kind(tmp_path / "empty")
    (out / "eval.json").write_text("{torn")
    with pytest.raises(RunDirError, match="not valid JSON"):
        read_json(out, "eval.json")


def test_reader_gives_heads_without_tokens_and_whole_records_by_position(eval_dir):
    with EpisodeReader(eval_dir) as reader:
        heads = list(reader.heads())
        assert len(reader) == 12 and "trajectories" not in heads[0]
        record = reader.record(5)
        assert record["episode_id"] == heads[5]["episode_id"] and len(record["trajectories"]) == 4


def test_versions_are_the_runs_own_record(eval_dir, dice_plugins, tmp_path):
    out = tmp_path / "r"
    shutil.copytree(eval_dir, out)
    recorded = json.loads((out / "provenance.json").read_text())
    recorded["versions"]["scaffold-core"] = "9.9.9-provenance"
    (out / "provenance.json").write_text(json.dumps(recorded))
    report = read_report(out, tokenizer=None, registry=dice_plugins.registry)
    assert report.versions_recorded and report.versions["scaffold-core"] == "9.9.9-provenance"
    # a directory of an earlier version, without provenance.json: the eval's own record
    (out / "provenance.json").unlink()
    figures = json.loads((out / "eval.json").read_text())
    figures["versions"]["scaffold-core"] = "9.9.9-recorded"
    (out / "eval.json").write_text(json.dumps(figures))
    report = read_report(out, tokenizer=None, registry=dice_plugins.registry)
    assert report.versions_recorded and report.versions["scaffold-core"] == "9.9.9-recorded"


def test_token_texts_come_from_the_saved_engine_or_are_missing_with_a_reason(dice_plugins, tmp_path):
    from scaffold_core.errors import ConfigError
    from scaffold_report.tokens import load_tokenizer, token_texts, tokenizer_for_run

    tokenizer, source = tokenizer_for_run({"engine": {"name": "benchmark_canned"}}, dice_plugins.registry)
    assert source == "the benchmark_canned engine's tokenizer"
    assert token_texts(tokenizer, [2, 6 + ord("a"), 6 + ord("a")]) == {2: "<|end|>", 6 + ord("a"): "a"}
    assert tokenizer_for_run({"engine": {"name": "gone"}}, dice_plugins.registry)[0] is None
    assert tokenizer_for_run({}, dice_plugins.registry) == (None, "the run saved no engine in config.yaml")
    assert token_texts(None, [1, 2]) == {}
    with pytest.raises(ConfigError, match="--tokenizer"):
        load_tokenizer(str(tmp_path / "no-such-tokenizer"))


def test_odd_records_from_plugins_still_make_a_page(tmp_path):
    """Metadata a plugin filled oddly (turns without positions, tool calls that are not dicts, a NaN reward)
    is shown as far as it makes sense, never a failed report."""
    from scaffold_core.episode import EpisodeResult, Sample
    from scaffold_core.output.rundir import RunOutput
    from scaffold_core.trajectory import TrainingSample
    from scaffold_core.verifier import Verdict

    sample = Sample([10, 11], [20, 21, 22], [-0.1, -2.0, -0.5], [1, 0, 1], "odd", "stop", 0, "v7",
                    Verdict(float("nan"), None, None, "?"),
                    metadata={"turns": [{"start": "x"}, {"start": 2, "end": 3, "index": 0}],
                              "tool_calls": ["junk", {"turn": 0, "name": 5, "arguments": {"a": [1, None]}}]})
    row = TrainingSample([10, 11, 20, 21, 22], [0, 0, 1, 0, 1], [0.0, 0.0, -0.1, 0.0, -0.5], [-1, -1, 7, -1, 7],
                         0.0, 0.0, "e1", 0, "e1", 2, "stop")
    out = RunOutput(tmp_path / "run")
    try:
        out.append(EpisodeResult("e1", 0, "ok", reference={"value": 3}, prompt_text="p", samples=[sample],
                                 trajectories=[row]))
    finally:
        out.close()
        out.release()
    html = build_report(tmp_path / "run", tokenizer=None).read_text()
    detail = page_data(html)["episodes"][0]["s"][0]
    assert detail["r"] is None and detail["tu"] == [[0, 1, 0]] and detail["m"] == [1, 1, 0, 1, 1, 1]
    assert detail["ver"] == [7, 1, -1, 1, 7, 1] and detail["lp"] == [-10, 0, -50]
    assert [c["n"] for c in detail["tc"]] == [5]


@pytest.mark.parametrize("order", ["reversed", "with a superseded record"])
def test_counts_read_in_one_pass_equal_the_episodes_in_order(dice_plugins, dice_config, tmp_path, order):
    from scaffold_core.episode import EpisodeResult
    from scaffold_core.output import read_records
    from scaffold_core.output.store import UPSERT, EpisodeStore
    from scaffold_report.episodes import scan

    config = dice_config(task={"name": "sums", "count": 30}, controller={"name": "native", "samples": 2})
    Rollout(config, output_dir=tmp_path / "run", plugins=dice_plugins, progress=False).run()
    records = list(read_records(tmp_path / "run"))
    (tmp_path / "run" / "episodes.db").unlink()
    store = EpisodeStore(tmp_path / "run" / "episodes.db")
    try:
        if order == "reversed":  # the order workers may finish in: the browser still numbers episodes by index
            rows = [(r["episode_id"], r["index"], r["status"], json.dumps({k: v for k, v in r.items()
                                                                          if k != "trajectories"}), None, None)
                    for r in reversed(records)]
            store.db.executemany(UPSERT, rows)
        else:  # an earlier failed attempt of episode 3 after its completed one: only the latter counts
            store.db.executemany(UPSERT, [(r["episode_id"], r["index"], r["status"], json.dumps(r), None, None)
                                          for r in records])
            store.put([EpisodeResult(records[3]["episode_id"], 3, "failed", error="engine raised",
                                     error_component="engine")])
    finally:
        store.close()
    report = read_report(tmp_path / "run", tokenizer=None, registry=dice_plugins.registry)
    with EpisodeReader(tmp_path / "run") as reader:
        expected = scan(reader.heads())
    assert report.stats.episodes == 30 and report.stats.failed == 0
    assert sorted(report.stats.rewards) == sorted(expected.rewards)
    assert report.stats.strata == expected.strata and report.stats.solved == expected.solved
    assert [e["i"] for e in report.episodes] == list(range(30))


def _counted_run(dice_plugins, dice_config, directory, controller, resume=False):
    """A run whose report counts are taken as its files are exported (as `scaffold run` does)."""
    from scaffold_report.episodes import Stats

    config = dice_config(task={"name": "sums", "count": 30}, controller=controller,
                         rollout={"max_failed_fraction": 1.0})
    rollout = Rollout(config, output_dir=directory, plugins=dice_plugins, progress=False, resume=resume)
    rollout.components.engine.fail = lambda prompt: "11 +" in prompt or "17 +" in prompt
    stats = Stats()
    rollout.run(on_head=lambda head: stats.add(stats.episodes, head))
    return stats


def _refuse_heads(monkeypatch):
    def refuse(*args):
        raise AssertionError("the report read every episode again: the run's counts were not used")
        yield

    monkeypatch.setattr(EpisodeReader, "heads", refuse)


@pytest.mark.parametrize("controller", [{"name": "native", "samples": 2},
                                        {"name": "repeat", "n": 3, "controller": {"name": "native"}}])
def test_the_report_counted_as_the_run_exported_is_the_one_its_store_gives(dice_plugins, dice_config, tmp_path,
                                                                           monkeypatch, controller):
    stats = _counted_run(dice_plugins, dice_config, tmp_path / "run", controller)
    _refuse_heads(monkeypatch)
    counted = read_report(tmp_path / "run", tokenizer=None, registry=dice_plugins.registry, stats=stats)
    monkeypatch.undo()
    read = read_report(tmp_path / "run", tokenizer=None, registry=dice_plugins.registry)
    assert read.stats.failed == 2 and read.stats.episodes == 30 and read.stats.solved  # failures, scored answers
    assert counted.stats == read.stats
    assert counted.episodes == read.episodes and counted.vocab == read.vocab


def test_counts_that_do_not_describe_the_store_are_not_used(dice_plugins, dice_config, tmp_path):
    from scaffold_core.episode import EpisodeResult
    from scaffold_core.output.store import EpisodeStore

    stats = _counted_run(dice_plugins, dice_config, tmp_path / "run", {"name": "native", "samples": 2})
    store = EpisodeStore(tmp_path / "run" / "episodes.db")
    try:  # another session recorded an episode after the run
        store.put([EpisodeResult("appended-later", 99, "failed", error="engine raised", error_component="engine")])
    finally:
        store.close()
    report = read_report(tmp_path / "run", tokenizer=None, registry=dice_plugins.registry, stats=stats)
    assert report.stats.episodes == 31  # the store's, not the run's 30


def test_scaffold_run_reports_from_what_it_counted(test_plugins, tmp_path, monkeypatch, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("task: {name: arithmetic, count: 12}\nengine: {name: benchmark_canned, response: '#### 4'}\n"
                      "rollout: {progress: false}\n")
    _refuse_heads(monkeypatch)
    assert main(["run", str(config), "-o", str(tmp_path / "run")]) == 0
    assert "WARNING" not in capsys.readouterr().err
    assert "All 12 episodes." in (tmp_path / "run" / "report.html").read_text()


def test_the_reward_band_of_a_training_chart_stays_within_the_rewards_given(tmp_path):
    from array import array

    from scaffold_report.contents import Report
    from scaffold_report.episodes import Stats
    from scaffold_report.page import training_section

    stats = Stats(rewards=array("d", [0.0, 1.0, 0.0]))
    steps = [{"step": i, "reward_mean": m, "reward_std": 0.5} for i, m in enumerate([0.1, 0.3, 0.6], 1)]
    html = training_section(Report(directory=tmp_path, kind="train", steps=steps, stats=stats))
    chart = re.search(r"<svg[^>]*aria-label=\"Reward[^\"]*\".*?</svg>", html, re.S).group(0)
    y_ticks = re.findall(r'text-anchor="end">([^<]+)</text>', chart)
    assert y_ticks and all(not t.startswith(("-", "−")) for t in y_ticks)  # 0/1 rewards: no band below 0


def test_training_charts_show_groups_learning_rate_length_clip_ratio_and_kl(tmp_path):
    from scaffold_report.contents import Report
    from scaffold_report.page import training_section

    steps = [{"step": i, "reward_mean": 0.5, "groups_used": 3, "groups_filtered": 1, "learning_rate": 1e-5 * i,
              "completion_length": 40.0 + i, "clip_ratio": 0.01 * i, "kl": 0.002 * i} for i in (1, 2, 3)]
    html = training_section(Report(directory=tmp_path, kind="train", steps=steps))
    titles = re.findall(r'aria-label="([^"]+)"', html)
    for title in ("Prompt groups", "Learning rate", "Completion length", "Clip ratio", "KL"):
        assert any(t.startswith(title) for t in titles), title
    groups = re.search(r'<svg[^>]*aria-label="Prompt groups[^"]*".*?</svg>', html, re.S).group(0)
    assert "groups_filtered" in groups and "groups_used" in groups


def test_the_browser_carries_each_episodes_spans_with_durations_and_shares(tmp_path):
    """The trajectory view of an episode shows where its time went: each span (queued, prefill, decode, tool
    calls by name, a weight-update wait, verify) from the episode's start, and each phase's share."""
    from scaffold_core.episode import EpisodeResult, Sample
    from scaffold_core.output.rundir import RunOutput
    from scaffold_core.verifier import Verdict

    spans = [["queued", 9.5, 10.0], ["prefill", 10.0, 10.25], ["decode", 10.25, 11.0],
             ["tool", 11.0, 11.5, "tool 'search'"], ["weight_wait", 11.5, 12.0], ["decode", 12.0, 12.5],
             ["verify", 12.5, 12.75]]
    sample = Sample([1], [2, 3], [-0.1, -0.2], [1, 1], "42", "stop", 0, 0, Verdict(1.0, "42", "42", "ok"))
    failed_spans = [["queued", 20.0, 20.5], ["generate", 20.5, 22.0]]
    out = RunOutput(tmp_path / "run")
    try:
        out.append(EpisodeResult("e1", 0, "ok", reference="42", prompt_text="p", samples=[sample], wall_s=3.0,
                                 spans=spans, started_s=10.0))
        out.append(EpisodeResult("e2", 1, "failed", error="EngineError: timed out", wall_s=2.0,
                                 spans=failed_spans, started_s=20.0))
    finally:
        out.close()
        out.release()
    html = build_report(tmp_path / "run", tokenizer=None).read_text()
    data = page_data(html)
    assert set(data["phases"]) >= {"queued", "prefill", "decode", "tool", "weight_wait", "verify"}  # their colours
    ok, failed = data["episodes"]
    timing = ok["sp"]
    assert timing["d"] == pytest.approx(3.5)  # from the queued span's start to the end of the wall time
    assert timing["s"][0] == ["queued", 0.0, 0.5] and timing["s"][3] == ["tool", 1.5, 2.0, "tool 'search'"]
    assert [s[0] for s in timing["s"]] == [s[0] for s in spans]
    assert timing["parts"] == pytest.approx({"queued": 0.5, "prefill": 0.25, "decode": 1.25, "tool": 0.5,
                                             "weight_wait": 0.5, "verify": 0.25, "other": 0.25})
    assert sum(timing["parts"].values()) == pytest.approx(timing["d"])
    assert failed["sp"]["s"] == [["queued", 0.0, 0.5], ["generate", 0.5, 2.0]]  # a failed episode's time too
    assert "function spanView" in html  # the view that draws them


def test_an_episode_with_many_spans_lists_the_first_and_says_how_many_more():
    from scaffold_report.episodes import episode_spans

    record = {"started_s": 0.0, "wall_s": 10.0, "spans": [["tool", i * 0.01, i * 0.01 + 0.005, f"call {i}"]
                                                         for i in range(1000)]}
    timing = episode_spans(record, limit=400)
    assert len(timing["s"]) == 400 and timing["more"] == 600 and timing["s"][-1][3] == "call 399"
    assert timing["parts"]["tool"] == pytest.approx(5.0, abs=1e-3)  # the shares count every span
    assert episode_spans({"spans": [["x", "not a time", 1]]}) is None and episode_spans({}) is None
