"""Zero-variance group filtering with bounded refill, every step's rollouts in the run's ledger, and `scaffold
train`'s files and --resume, on a scripted engine (no model)."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from scaffold_testkit import ListTask, ScriptedEngine

from scaffold_core.builtins.controllers import NativeController
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.cli import main
from scaffold_core.run.assembly import Components
from scaffold_core.run.summary import ExitCode
from scaffold_core.sampling import SamplingParams
from scaffold_core.train.filtering import GroupFilter, refill_from, run_step_groups
from scaffold_core.train.prompt_groups import TrainingRollouts
from scaffold_core.train.step_ledger import StepLedger

#: "fixed" rows are always answered right (their groups have equal rewards); "coin" rows right on even samples.
ROWS = [{"id": "fixed-0", "question": "fixed 0", "answer": "1"}, {"id": "coin-1", "question": "coin 1", "answer": "1"},
        {"id": "fixed-2", "question": "fixed 2", "answer": "1"}, {"id": "coin-3", "question": "coin 3", "answer": "1"},
        {"id": "fixed-4", "question": "fixed 4", "answer": "1"}]


def respond(prompt: str, request) -> str:
    serial = int(request.episode_id.rsplit("/", 1)[-1])
    return "1" if "fixed" in prompt or serial % 2 == 0 else "0"


def rollouts(rows=ROWS) -> TrainingRollouts:
    return TrainingRollouts(Components(task=ListTask(rows), controller=NativeController(),
                                       engine=ScriptedEngine(respond), verifier=ExactMatchVerifier()),
                            sampling=SamplingParams(max_tokens=4, seed=3))


def step(first: list[int], mode: str, rounds: int, *, rows=ROWS, number: int = 1):
    async def go():
        async with rollouts(rows) as r:
            pool = list(enumerate(r.rows()))
            chosen = [pool[i] for i in first]
            return await run_step_groups(r, chosen, samples=2, step=number, group_filter=GroupFilter(mode, rounds),
                                         refill=refill_from(pool, chosen, seed=r.sampling.seed, step=number))
    return asyncio.run(go())


def test_groups_with_equal_rewards_are_replaced_by_fresh_prompts_until_the_step_is_full():
    groups = step([0, 2], "zero_variance", 2)  # both fixed: refilled from the other rows
    assert len(groups.used) == 2 and {g.row["id"] for g in groups.used} == {"coin-1", "coin-3"}
    assert all(len(set(g.rewards)) == 2 for g in groups.used) and not groups.skipped
    assert all(g.row["id"].startswith("fixed") for g in groups.filtered)
    metrics = groups.metrics()
    assert metrics["groups_used"] == 2 and metrics["groups_filtered"] == len(groups.filtered) >= 2
    assert metrics["refill_rounds"] >= 1 and metrics["samples"] == 2 * len(groups.groups)
    # the draws and the seeds depend on the seed and the step only: the same step again is the same step
    again = step([0, 2], "zero_variance", 2)
    assert [g.group_id for g in again.groups] == [g.group_id for g in groups.groups]
    assert [s.episode_id for g in again.groups for s in g.samples] == \
        [s.episode_id for g in groups.groups for s in g.samples]
    assert all(g.group_id.startswith("s1/r") for g in groups.groups)


def test_a_step_with_no_informative_group_is_skipped_after_the_refill_rounds():
    fixed = [r for r in ROWS if r["id"].startswith("fixed")]
    groups = step([0, 1], "zero_variance", 3, rows=fixed)
    assert groups.skipped and groups.used == [] and groups.refill_rounds == 3
    assert len(groups.filtered) == 2 + 2 * 3  # 2 groups, then 2 more per round (rows tried again get new seeds)
    assert len({s.episode_id for g in groups.filtered for s in g.samples}) == 16
    none = step([0, 1], "zero_variance", 0, rows=fixed)
    assert none.skipped and none.refill_rounds == 0 and len(none.filtered) == 2


def test_filter_none_keeps_every_group_and_options_are_checked():
    groups = step([0, 1], "none", 2)
    assert [g.row["id"] for g in groups.used] == ["fixed-0", "coin-1"] and groups.refill_rounds == 0
    with pytest.raises(ValueError, match="filter_groups must be one of none, zero_variance"):
        GroupFilter("all")
    with pytest.raises(ValueError, match="max_refill_rounds must be an integer >= 0"):
        GroupFilter("none", -1)


def test_every_step_goes_to_the_ledger_with_its_step_version_and_use_and_rewinds_to_a_checkpoint(tmp_path):
    import datasets

    ledger = StepLedger(tmp_path / "run")
    try:
        first = step([0, 2], "zero_variance", 2)
        ledger.write_step(first, weight_version=0, advantages=[0.5, -0.5, 0.25, -0.25])
        state = ledger.state()
        ledger.write_step(step([1, 3], "zero_variance", 2, number=2), weight_version=1)
        assert ledger.state() != state
        with pytest.raises(ValueError, match="3 advantages for 4 samples"):
            ledger.write_step(first, weight_version=0, advantages=[0.0] * 3)
        ledger.rewind(state)  # a resume from the checkpoint taken after step 1
        assert ledger.state() == state
        metrics = ledger.finish()
    finally:
        ledger.close()
    assert metrics["episodes"] == 2 * len(first.groups)
    rows = datasets.load_from_disk(str(tmp_path / "run" / "trajectories"))
    assert set(rows["step"]) == {1} and set(rows["weight_version"]) == {0}
    used = rows.filter(lambda r: r["used"])
    assert sorted(used["advantage"]) == [-0.5, -0.25, 0.25, 0.5]
    assert {g.split("/")[-1] for g in used["group_id"]} == {"coin-1", "coin-3"}
    assert all(a == 0.0 for a in rows.filter(lambda r: not r["used"])["advantage"])
    assert set(rows["completion_text"]) <= {"0", "1"} and all(t for t in rows["prompt_text"])
    assert (tmp_path / "run" / "samples.jsonl").is_file() and (tmp_path / "run" / "metrics.json").is_file()


def test_rewinding_to_a_store_longer_than_the_file_is_refused(tmp_path):
    from scaffold_core.errors import RunDirError

    ledger = StepLedger(tmp_path / "run")
    try:
        ledger.write_step(step([1], "none", 0), weight_version=0)
        with pytest.raises(RunDirError, match="before the row 999999 the checkpoint recorded"):
            ledger.rewind({"store_rows": 999999})
    finally:
        ledger.close()


def write_config(tmp_path, name="train.yaml", **trainer):
    data = {"task": {"name": "list", "rows": [{"id": "a", "question": "1 + 1?", "answer": "2"},
                                              {"id": "b", "question": "2 + 2?", "answer": "4"}]},
            "engine": {"name": "benchmark_canned", "response": "2"}, "sampling": {"max_tokens": 8},
            "trainer": {"name": "rollout_only", **trainer}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_scaffold_train_keeps_rollouts_timings_apart_and_resumes_only_the_same_config(tmp_path, test_plugins,
                                                                                      capsys):
    """The canned model answers "2" to everything: every group has equal rewards, so with filtering every step
    is skipped (counted), and every step's rollouts still reach the ledger and its dataset."""
    out = tmp_path / "run"
    cfg = write_config(tmp_path, steps=2, group=2, filter_groups="zero_variance", max_refill_rounds=1)
    assert main(["train", str(cfg), "-o", str(out), "--no-progress", "--no-report", "--json"]) == ExitCode.OK
    steps = [json.loads(line) for line in (out / "train_metrics.jsonl").read_text().splitlines()]
    assert [(s["step"], s["skipped"], s["steps_skipped"]) for s in steps] == [(1, 1, 1), (2, 1, 2)]
    assert all(s["groups_filtered"] == 4 and s["refill_rounds"] == 1 for s in steps)
    assert not any(k.endswith("_s") for s in steps for k in s)  # clock readings live apart
    timings = [json.loads(line) for line in (out / "train_timings.jsonl").read_text().splitlines()]
    assert [t["step"] for t in timings] == [1, 2] and all(t["wall_s"] >= 0 for t in timings)
    from scaffold_core.output.reader import read_train_steps

    assert [s["wall_s"] for s in read_train_steps(out)] == [t["wall_s"] for t in timings]  # the report's view
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps_skipped"] == 2 and summary["rollouts_on_disk"]["episodes"] == 16
    import datasets

    assert datasets.load_from_disk(str(out / "trajectories")).num_rows == 16

    changed = write_config(tmp_path, "changed.yaml", steps=3, group=2, filter_groups="zero_variance",
                           max_refill_rounds=1)
    assert main(["train", str(changed), "-o", str(out), "--resume", "--no-progress", "--no-report"]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "trainer.steps: 2 -> 3" in err and f"scaffold train {out / 'config.yaml'}" in err
    assert main(["train", str(cfg), "-o", str(out), "--resume", "--overwrite"]) == ExitCode.ERROR
    assert "pass one" in capsys.readouterr().err
    assert main(["train", str(cfg), "-o", str(tmp_path / "none"), "--resume"]) == ExitCode.ERROR
    assert "holds no training run to continue" in capsys.readouterr().err
    # the same config resumes (rollout_only keeps no checkpoint: it starts over), each step recorded once
    assert main(["train", str(cfg), "-o", str(out), "--resume", "--no-progress", "--no-report"]) == ExitCode.OK
    steps = [json.loads(line) for line in (out / "train_metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert datasets.load_from_disk(str(out / "trajectories")).num_rows == 16


def test_a_training_runs_throughput_is_over_its_rollout_time_never_the_time_to_write_its_files(tmp_path):
    """metrics.json of a training run once said 12,267 tok/s: tokens over the 0.03 s its files took to write."""
    ledger = StepLedger(tmp_path / "run")
    try:
        ledger.write_step(step([0, 2], "none", 0), weight_version=0)
        metrics = ledger.finish()
    finally:
        ledger.close()
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert "tokens_per_s" not in saved and "wall_s" not in saved and "tokens_per_s" not in metrics
    ledger = StepLedger(tmp_path / "run2")
    try:
        ledger.write_step(step([0, 2], "none", 0), weight_version=0)
        metrics = ledger.finish(rollout_s=4.0)
    finally:
        ledger.close()
    saved = json.loads((tmp_path / "run2" / "metrics.json").read_text())
    assert saved["wall_s"] == 4.0 and saved["tokens_per_s"] == round(saved["generated_tokens"] / 4.0, 3)
