"""``scaffold train``: runs the configured trainer with per-step metrics and files, and fails in one line
on a bad trainer section (before any model loads)."""

from __future__ import annotations

import json

import pytest
import yaml

from scaffold_core.cli import main
from scaffold_core.run.summary import ExitCode

ROWS = [{"id": "a", "question": "1 + 1?", "answer": "2"}, {"id": "b", "question": "2 + 2?", "answer": "4"}]



def write_config(tmp_path, **trainer):
    data = {"task": {"name": "list", "rows": ROWS}, "engine": {"name": "benchmark_canned", "response": "2"},
            "sampling": {"max_tokens": 8}, "trainer": {"name": "rollout_only", **trainer}}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_train_runs_the_trainer_and_writes_metrics_per_step(tmp_path, test_plugins, capsys):
    out = tmp_path / "run"
    code = main(["train", str(write_config(tmp_path, steps=3, group=2)), "-o", str(out), "--no-progress", "--json"])
    captured = capsys.readouterr()
    assert code == ExitCode.OK
    steps = [json.loads(line) for line in (out / "train_metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3] and all(s["reward_mean"] == 0.5 for s in steps)
    assert all(s["version"] == 0 and s["stale_dropped"] == 0 and "wall_s" not in s for s in steps)
    timings = [json.loads(line) for line in (out / "train_timings.jsonl").read_text().splitlines()]
    assert [t["step"] for t in timings] == [1, 2, 3] and all(t["wall_s"] >= 0 for t in timings)
    assert "step 2/3  reward_mean=0.5  version=0  stale_dropped=0" in captured.err
    summary = json.loads(captured.out)
    assert summary["steps"] == 3 and summary["rollouts"]["samples"] == 12
    assert json.loads((out / "train_summary.json").read_text())["rollouts"]["groups"] == 6
    assert (out / "config.yaml").is_file()
    # a second run into the same directory is refused unless asked to overwrite
    assert main(["train", str(write_config(tmp_path)), "-o", str(out), "--no-progress"]) == ExitCode.ERROR
    assert "already holds a training run" in capsys.readouterr().err
    assert main(["train", str(write_config(tmp_path)), "-o", str(out), "--no-progress", "--overwrite"]) == 0


@pytest.mark.parametrize("trainer, expected", [
    ({"name": "rollout_onyl"}, "trainer.name: unknown trainer 'rollout_onyl'"),
    ({"name": "rollout_only", "stepz": 2}, "trainer.stepz"),
    ({"name": "rollout_only", "steps": 0}, "trainer.steps: Input should be greater than or equal to 1; got 0"),
])
def test_a_bad_trainer_section_fails_in_one_line(tmp_path, test_plugins, capsys, trainer, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"task": {"name": "list", "rows": ROWS}, "trainer": trainer}))
    assert main(["train", str(path), "-o", str(tmp_path / "run")]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_train_needs_a_trainer_section(tmp_path, test_plugins, capsys):
    path = tmp_path / "no_trainer.yaml"
    path.write_text(yaml.safe_dump({"task": {"name": "list", "rows": ROWS}}))
    assert main(["train", str(path), "-o", str(tmp_path / "run")]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "needs a trainer section" in err and "rollout_only" in err and len(err.strip().splitlines()) == 1


def test_the_progress_bar_counts_steps_and_shows_the_reward(tmp_path):
    import io

    import scaffold_testkit.plugin as test_tasks
    from scaffold_testkit import plugin_set

    from scaffold_core.config import load_config
    from scaffold_core.train.session import run_training

    pset = plugin_set(test_tasks)
    config = load_config(write_config(tmp_path, steps=2, group=2), registry=pset.registry)
    stream = io.StringIO()
    run_training(config, tmp_path / "run", registry=pset.registry, progress=True, stream=stream)
    text = stream.getvalue()
    assert "training: 100%" in text and "2/2" in text and "reward=0.500" in text
    assert "step 1/2  reward_mean=0.5" in text


def test_train_and_run_end_with_a_short_summary_not_a_json_dump(tmp_path, test_plugins, capsys):
    assert main(["train", str(write_config(tmp_path, steps=2, group=2)), "-o", str(tmp_path / "t"),
                 "--no-progress", "--no-report"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert out.startswith("steps") and "{" not in out and len(out.strip().splitlines()) <= 8
    assert "rollouts  " in out and str(tmp_path / "t") in out
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"task": {"name": "list", "rows": ROWS},
                                   "engine": {"name": "benchmark_canned", "response": "2"}}))
    assert main(["run", str(run), "-o", str(tmp_path / "r"), "--no-progress", "--no-report"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert out.startswith("episodes") and "{" not in out and len(out.strip().splitlines()) <= 8
    assert "accuracy  0.500" in out and "metrics.json" in out  # the rows ask for 2 and 4; it answers 2
    assert main(["run", str(run), "-o", str(tmp_path / "r2"), "--no-progress", "--no-report", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2  # --json: the metrics, for scripts


@pytest.mark.parametrize("command", ["train", "run", "eval", "config"])
def test_a_malformed_set_is_a_usage_error_exit_2(tmp_path, test_plugins, capsys, command):
    with pytest.raises(SystemExit) as exited:
        main([command, str(write_config(tmp_path)), "--set", "trainer.steps"])
    assert exited.value.code == ExitCode.USAGE
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_train_takes_unset(tmp_path, test_plugins):
    out = tmp_path / "t"
    assert main(["train", str(write_config(tmp_path, steps=1, group=3)), "-o", str(out), "--no-progress",
                 "--no-report", "--unset", "trainer.group"]) == ExitCode.OK
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["trainer"] == {"name": "rollout_only", "steps": 1}  # group removed: its default applies


@pytest.mark.parametrize("command", ["run", "eval"])
def test_resume_with_overwrite_is_refused_before_anything_is_touched(tmp_path, test_plugins, capsys, command):
    out = tmp_path / "r"
    assert main(["run", str(write_config(tmp_path)), "-o", str(out), "--no-progress", "--no-report"]) == 0
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    assert main([command, str(write_config(tmp_path)), "-o", str(out), "--resume", "--overwrite"]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "--resume continues the run" in err and "pass one" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_row_without_an_answer_is_unscored_never_a_zero_in_accuracy(tmp_path, test_plugins, capsys):
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"task": {"name": "list", "rows": [ROWS[0], {"id": "c", "question": "3 + 3?"}]},
                                   "engine": {"name": "benchmark_canned", "response": "2"},
                                   "verifier": {"name": "exact_match"}}))
    assert main(["run", str(run), "-o", str(tmp_path / "r"), "--no-progress", "--no-report"]) == ExitCode.OK
    captured = capsys.readouterr()
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert metrics["unscored_samples"] == 1 and metrics["accuracy"] == 1.0  # the scored row only
    assert "samples   2 (1 unscored)" in captured.out and "have no reward" in captured.err
