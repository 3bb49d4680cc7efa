"""`scaffold train` with TRL end to end, on a tiny policy (one Llama layer, SmolLM2's tokenizer), in subprocesses
as a user runs it: groups with equal rewards are filtered and refilled, a step with none takes no optimizer step,
every step's rollouts are on disk, a run killed with SIGKILL resumes from its checkpoint with every step once, two
seeded runs are identical to the byte, and the tracking sinks hold every step."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("trl")

pytestmark = [pytest.mark.model, pytest.mark.slow]

#: reference ``length``: a graded reward (samples of a prompt almost never tie); ``zero``/``one``: every sample of
#: the prompt gets the same reward, so its groups teach nothing.
MIXED = [{"id": "a", "question": "Name a fruit.", "answer": "length"},
         {"id": "b", "question": "Name a color.", "answer": "zero"},
         {"id": "c", "question": "Say hello.", "answer": "length"},
         {"id": "d", "question": "Name an animal.", "answer": "one"}]
HELD_OUT = [{"id": "h1", "question": "Name a bird.", "answer": "length"},
            {"id": "h2", "question": "Name a sea.", "answer": "one"}]


def config(tmp_path, policy, name: str, rows, **trainer) -> str:
    data = {"task": {"name": "list", "rows": rows}, "verifier": {"name": "by_reference"},
            "engine": {"name": "transformers", "model": str(policy), "threads": 1},
            "sampling": {"max_tokens": 8, "temperature": 1.0, "seed": 0},
            "trainer": {"name": "trl", "num_generations": 2, "prompts_per_step": 2, "learning_rate": 1e-3,
                        "threads": 1, "deterministic": True, **trainer}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_seeded_runs_are_identical_and_every_step_is_in_the_sinks(tmp_path, tiny_policy, train_cli):
    """Two 3-step runs with the documented settings (seed, one thread, deterministic): the same
    train_metrics.jsonl byte for byte and the same final weights. The run filters (the rows whose rewards
    never differ are never trained on), evaluates held-out rows, and reports to TensorBoard and trackio."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("trackio")
    cfg = config(tmp_path, tiny_policy, "mixed", MIXED, max_steps=3, save_steps=3, eval_every=3,
                 eval_task={"rows": HELD_OUT}, eval_samples=2, report_to=["tensorboard", "trackio"])
    env = {"TRACKIO_DIR": str(tmp_path / "trackio")}
    runs = [tmp_path / "run1", tmp_path / "run2"]
    for run in runs:
        done = train_cli(cfg, "-o", str(run), env=env)
        json.loads(done.stdout)  # stdout holds the summary alone (trackio's own lines went to stderr)
    metrics = [(run / "train_metrics.jsonl").read_bytes() for run in runs]
    assert metrics[0] == metrics[1]
    assert sha256(runs[0] / "final" / "model.safetensors") == sha256(runs[1] / "final" / "model.safetensors")
    assert sha256(runs[0] / "final" / "model.safetensors") != sha256(tiny_policy / "model.safetensors")
    steps = lines(runs[0] / "train_metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2, 3] and not any("wall_s" in s or "rollout_s" in s for s in steps)
    assert [t["step"] for t in lines(runs[0] / "train_timings.jsonl")] == [1, 2, 3]
    assert 0 <= steps[2]["eval_reward_mean"] and steps[2]["eval_prompts"] == 2 and "eval_pass@1" in steps[2]
    assert sum(s["groups_filtered"] for s in steps) > 0

    # every step's rollouts are on disk: only groups whose rewards differ were trained on
    import datasets

    rows = datasets.load_from_disk(str(runs[0] / "trajectories"))
    assert sorted(set(rows["step"])) == [1, 2, 3]
    used = rows.filter(lambda r: r["used"])
    assert used.num_rows == sum(s["completions"] for s in steps) > 0
    assert {g.split("/")[-1] for g in used["group_id"]} <= {"a", "c"}  # never the zero/one rows
    for group in set(used["group_id"]):
        rewards = [r for g, r in zip(used["group_id"], used["reward"]) if g == group]
        assert len(rewards) == 2 and rewards[0] != rewards[1]
    assert all(a != 0 for a in used["advantage"]) and all(w == s - 1 for w, s in zip(rows["weight_version"],
                                                                                        rows["step"]))
    assert all(v == w for r in rows for v, m, w in zip(r["versions"], r["loss_mask"], [r["weight_version"]] * 99)
               if m)
    assert all(text for text in used["completion_text"]) and all(text for text in rows["prompt_text"])

    # the sinks: reward_mean of every step, read back by each tool's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(runs[0] / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 5)) for e in events.Scalars("train/reward_mean")] == \
        [(s["step"], round(s["reward_mean"], 5)) for s in steps]
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3]
    script = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
              "print(json.dumps(SQLiteStorage.get_logs('scaffold', 'run1'), default=str))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, **env}).stdout
    logged = {log["step"]: log["train/reward_mean"] for log in json.loads(out) if "train/reward_mean" in log}
    assert logged == pytest.approx({s["step"]: s["reward_mean"] for s in steps})


def test_a_run_killed_during_step_3_resumes_and_finishes_with_every_step_once(tmp_path, tiny_policy, train_cli):
    cfg = config(tmp_path, tiny_policy, "six", [dict(r, answer="length") for r in MIXED], max_steps=6,
                 save_steps=2, filter_groups="none")
    run, held = tmp_path / "run", tmp_path / "held"
    env = {**os.environ, "SCAFFOLD_EXTRA_PLUGINS": "scaffold_testkit.plugin,training_plugin",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]),
           # 2 prompts x 2 samples per step: verification 9 is the first of step 3
           "SCAFFOLD_TEST_HOLD_AT": "9", "SCAFFOLD_TEST_HOLD_FILE": str(held),
           "TMPDIR": str(tmp_path)}  # what a killed process leaves in its temp folder stays in the test's
    proc = subprocess.Popen([sys.executable, "-m", "scaffold_core.cli", "train", cfg, "-o", str(run), "--no-progress",
                             "--no-report"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not held.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert held.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "not held"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
        proc.stderr.close()
    assert [s["step"] for s in lines(run / "train_metrics.jsonl")] == [1, 2]
    assert (run / "checkpoint-2" / "scaffold_state.json").is_file()

    changed = config(tmp_path, tiny_policy, "changed", [dict(r, answer="length") for r in MIXED], max_steps=6,
                     save_steps=2, filter_groups="none", learning_rate=5e-3)
    refused = train_cli(changed, "-o", str(run), "--resume", check=False)
    assert refused.returncode != 0 and "trainer.learning_rate: 0.001 -> 0.005" in refused.stderr
    assert "scaffold train" in refused.stderr and len(refused.stderr.strip().splitlines()) <= 2

    done = train_cli(cfg, "-o", str(run), "--resume")
    summary = json.loads(done.stdout)
    assert summary["steps"] == 6 and summary["resumed_from"].endswith("checkpoint-2")
    steps = lines(run / "train_metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [s["version"] for s in steps] == [0, 1, 2, 3, 4, 5]
    assert [t["step"] for t in lines(run / "train_timings.jsonl")] == [1, 2, 3, 4, 5, 6]
    import datasets

    rows = datasets.load_from_disk(str(run / "trajectories"))
    assert sorted(rows["step"]) == sorted([s for s in range(1, 7) for _ in range(4)])  # each step's 4 samples once
    assert len(set(rows["episode_id"])) == rows.num_rows


def test_a_task_whose_groups_all_have_equal_rewards_takes_no_optimizer_step(tmp_path, tiny_policy, training_plugin):
    """Every row's samples get the same reward: each step draws the other rows (bounded), finds nothing to learn
    from, and skips its optimizer step: the weights and the optimizer's state stay as they were."""
    import scaffold_testkit.plugin as test_tasks
    import torch
    from scaffold_testkit import plugin_set

    import scaffold_trl
    from scaffold_core.config import load_config
    from scaffold_core.errors import ScaffoldError
    from scaffold_core.train.session import run_training

    pset = plugin_set(test_tasks, scaffold_trl, training_plugin)
    cfg = config(tmp_path, tiny_policy, "flat", [dict(r, answer="zero" if r["answer"] == "length" else r["answer"])
                                                 for r in MIXED], max_steps=2, save_steps=2, max_refill_rounds=1)
    with pytest.raises(ScaffoldError, match="the run trained nothing: all 2 step.s. were skipped"):
        run_training(load_config(cfg, registry=pset.registry), tmp_path / "run", registry=pset.registry,
                     progress=False)  # a run that changed no weight is a failure, its files kept
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["optimizer_steps"] == 0
    steps = lines(tmp_path / "run" / "train_metrics.jsonl")
    assert summary["steps_skipped"] == 2 and [s["steps_skipped"] for s in steps] == [1, 2]
    assert all(s["skipped"] == 1 and s["groups_used"] == 0 and s["refill_rounds"] == 1 for s in steps)
    assert all(s["groups_filtered"] == 4 and "loss" not in s and "grad_norm" not in s for s in steps)
    assert sha256(tmp_path / "run" / "final" / "model.safetensors") == sha256(tiny_policy / "model.safetensors")
    optimizer = torch.load(tmp_path / "run" / "checkpoint-2" / "optimizer.pt", weights_only=True)
    assert optimizer["state"] == {}  # AdamW never stepped: no moments, no step count
    import datasets

    rows = datasets.load_from_disk(str(tmp_path / "run" / "trajectories"))
    assert rows.num_rows == 16 and not any(rows["used"])  # 2 steps x 4 groups x 2 samples, none trained on


def test_a_sink_whose_package_is_missing_fails_in_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    import scaffold_trl
    from scaffold_trl import tracking

    real = importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name, *a: None if name == "trackio"
                        else real(name, *a))
    with pytest.raises(ValueError, match=r"^report_to: trackio needs the trackio package, which is not installed: "
                                         r"pip install 'scaffold-trl\[trackio\]'$"):
        scaffold_trl.TRLTrainer(report_to=["trackio"])
    assert scaffold_trl.TRLTrainer(report_to=[]).report_to == []
