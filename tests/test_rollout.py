"""`scaffold run` end to end on the benchmark engine: output files, metrics, resume, `scaffold score`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import zlib

import datasets
import pytest
from scaffold_testkit import ListTask, plugin_set

from scaffold_core import hookimpl
from scaffold_core.config import load_config
from scaffold_core.engines.canned import CannedBenchmarkEngine
from scaffold_core.errors import ConfigError
from scaffold_core.output import read_records
from scaffold_core.run.rollout import Rollout


class NumbersTask(ListTask):
    default_config = {"verifier": {"name": "exact_match"}}

    def __init__(self, n: int = 6, answer: str = "42"):
        super().__init__([{"id": f"n{i}", "question": f"Q{i}", "answer": answer} for i in range(n)])


class StreamedTask(ListTask):
    """Rows made by a generator, as a large dataset would stream them; counts how often it is loaded."""

    default_config = {"verifier": {"name": "exact_match"}}
    loads = 0

    def __init__(self, n: int = 50):
        super().__init__([])
        self.n = n

    def load(self):
        type(self).loads += 1
        for i in range(self.n):
            yield {"id": f"s{i}", "question": f"Q{i}", "answer": "42" if i % 3 else "7"}


class StaggeredEngine(CannedBenchmarkEngine):
    """Episodes that finish out of order (0-30 ms each, by episode), and fail while their episode is
    in ``failing``."""

    failing: set[str] = set()

    async def generate(self, request):
        await asyncio.sleep(zlib.crc32(request.episode_id.encode()) % 7 / 200)
        if request.episode_id in self.failing:
            raise RuntimeError(f"{request.episode_id} is unlucky today")
        return await super().generate(request)


class Plugin:
    @hookimpl
    def register_tasks(self, registry):
        registry.add("numbers", NumbersTask)
        registry.add("streamed", StreamedTask)

    @hookimpl
    def register_engines(self, registry):
        registry.add("staggered", StaggeredEngine)


@pytest.fixture(scope="module")
def plugins():
    return plugin_set(numbers=Plugin())


def run(plugins, tmp_path, text: str, *overrides, resume=False, out="out"):
    config = load_config(data=__import__("yaml").safe_load(text), registry=plugins.registry,
                         overrides=list(overrides))
    rollout = Rollout(config, output_dir=tmp_path / out, resume=resume, plugins=plugins, progress=False)
    return rollout.run(), tmp_path / out


BASE = "task: {name: numbers}\nengine: {name: benchmark_canned, response: '42'}\nsampling: {max_tokens: 16}\n"


def test_run_writes_samples_metrics_dataset_and_config(plugins, tmp_path):
    metrics, out = run(plugins, tmp_path, BASE + "controller: {name: majority_vote, samples: 4}\n")
    assert metrics["episodes"] == 6 and metrics["completed"] == 6 and metrics["failed"] == 0
    assert metrics["maj@4"] == 1.0 and metrics["pass@4"] == 1.0 and metrics["accuracy"] == 1.0
    assert metrics["generated_tokens"] == 6 * 4 * 3  # "42" + EOS in bytes
    assert json.loads((out / "metrics.json").read_text())["maj@4"] == 1.0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 24
    assert {s["episode_id"] for s in samples} == {f"n{i}" for i in range(6)}
    first = samples[0]
    for key in ("prompt", "response", "answer", "extracted", "reward", "finish_reason"):
        assert key in first
    assert first["prompt"].startswith("<|user|>\nQ0") and first["answer"] == "42" and first["reward"] == 1.0
    ds = datasets.load_from_disk(str(out / "trajectories"))
    assert len(ds) == 24
    assert {"input_ids", "loss_mask", "logprobs", "versions", "reward", "advantage"} <= set(ds.column_names)
    row = ds[0]
    assert len(row["input_ids"]) == len(row["loss_mask"]) == len(row["logprobs"]) == len(row["versions"])
    assert sum(row["loss_mask"]) == 3
    resolved = (out / "config.yaml").read_text()
    assert "majority_vote" in resolved and "max_tokens: 16" in resolved


def test_length_truncation_is_reported(plugins, tmp_path, capsys):
    from scaffold_core.run.summary import print_summary

    metrics, _ = run(plugins, tmp_path, BASE, "sampling.max_tokens=1")
    assert metrics["truncated_fraction"] == 1.0
    print_summary(metrics)
    assert "100% of responses stopped because they hit max_tokens" in capsys.readouterr().err


def test_existing_output_dir_is_never_clobbered(plugins, tmp_path):
    run(plugins, tmp_path, BASE)
    with pytest.raises(ConfigError, match="already holds a run"):
        run(plugins, tmp_path, BASE)
    (tmp_path / "out" / "notes.txt").write_text("mine")
    metrics, out = run(plugins, tmp_path, BASE, "output.overwrite=true")
    assert metrics["completed"] == 6 and (out / "notes.txt").read_text() == "mine"


def test_resume_redoes_no_completed_episode(plugins, tmp_path):
    _, out = run(plugins, tmp_path, BASE)
    # Simulate a kill after 3 episodes (the 4th's step not written).
    with contextlib.closing(sqlite3.connect(out / "episodes.db")) as db:
        db.execute("DELETE FROM episodes WHERE seq > 3")
        db.commit()
    metrics, _ = run(plugins, tmp_path, BASE, resume=True)
    assert metrics["resumed_episodes"] == 3 and metrics["session"]["episodes"] == 3
    ids = [r["episode_id"] for r in read_records(out)]
    assert sorted(ids) == sorted(f"n{i}" for i in range(6)) and len(ids) == len(set(ids))
    assert metrics["completed"] == 6
    assert len((out / "samples.jsonl").read_text().splitlines()) == 6


def test_rows_a_task_generates_are_counted_then_run_without_being_held(plugins, tmp_path):
    text = "task: {name: streamed, n: 50}\nengine: {name: benchmark_canned, response: '42'}\n"
    StreamedTask.loads = 0
    metrics, out = run(plugins, tmp_path, text)
    assert StreamedTask.loads == 2  # once to count (and check) the rows, once to run them
    assert metrics["episodes"] == 50 and metrics["completed"] == 50
    assert metrics["accuracy"] == pytest.approx(33 / 50)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["episode_id"] for s in samples] == [f"s{i}" for i in range(50)]
    with contextlib.closing(sqlite3.connect(out / "episodes.db")) as db:  # killed after 20 episodes
        db.execute("DELETE FROM episodes WHERE seq > 20")
        db.commit()
    metrics, _ = run(plugins, tmp_path, text, resume=True)
    assert metrics["resumed_episodes"] == 20 and metrics["session"]["episodes"] == 30
    assert metrics["completed"] == 50


def test_a_run_exported_as_it_goes_writes_what_an_export_at_its_end_writes(plugins, tmp_path, monkeypatch):
    """Failed episodes, a kill, a resume that completes them: the files a process writes as the episodes become
    final are those one pass at the end writes."""
    import scaffold_core.output.export as export_module
    import scaffold_core.run.finalize as finalize_module

    text = ("task: {name: streamed, n: 300}\nengine: {name: staggered, response: '42'}\n"
            "rollout: {concurrency: 8, retries: 0}\n")
    marks: list[int] = []
    mark = export_module.ExportProcess.mark
    monkeypatch.setattr(export_module.ExportProcess, "mark", lambda self, i: (marks.append(i), mark(self, i)))
    monkeypatch.setattr(export_module, "FOLLOW_ROWS", 10)
    monkeypatch.setattr(finalize_module, "usable_cores", lambda: 2)
    outs: dict[tuple[str, bool], dict] = {}
    for follow in (False, True):
        monkeypatch.setattr(finalize_module, "EXPORT_PROCESS_EPISODES", 1 if follow else 1 << 60)
        StaggeredEngine.failing = {f"s{i}" for i in range(4, 300, 13)}
        first, out = run(plugins, tmp_path, text, out=f"follow-{follow}")
        assert first["failed"] == 23
        assert marks == sorted(marks) and (len(marks) > 10) == follow, marks  # told as it went, in order
        marks.clear()
        outs["first", follow] = files(out)
        with contextlib.closing(sqlite3.connect(out / "episodes.db")) as db:  # killed: the last steps lost
            db.execute("DELETE FROM episodes WHERE seq > (SELECT max(seq) FROM episodes) - 150")
            db.commit()
        StaggeredEngine.failing = set()
        metrics, _ = run(plugins, tmp_path, text, resume=True, out=f"follow-{follow}")
        assert metrics["completed"] == 300 and metrics["session"]["episodes"] >= 150
        assert marks == sorted(marks) and (len(marks) > 3) == follow, marks
        marks.clear()
        outs["resumed", follow] = files(out)
        assert not [p.name for p in out.iterdir() if p.name.startswith(".") and p.name != ".scaffold.lock"]
    for when in ("first", "resumed"):
        assert outs[when, True] == outs[when, False], when
    assert [json.loads(line)["episode_id"] for line in outs["resumed", True]["samples.jsonl"].splitlines()] \
        == [f"s{i}" for i in range(300)]


def files(out):
    return {**{name: (out / name).read_bytes() for name in ("samples.jsonl", "failures.jsonl")},
            "trajectories": datasets.load_from_disk(str(out / "trajectories")).to_list()}


def test_failed_episodes_are_listed_with_reasons(plugins, tmp_path):
    metrics, out = run(plugins, tmp_path, BASE, "rollout.request_timeout=0.05", "engine.delay_s=1")
    assert metrics["failed"] == 6 and metrics["failures"] == {"engine": 6}
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert len(failures) == 6 and all("request_timeout" in f["error"] for f in failures)
    assert (out / "samples.jsonl").read_text() == ""


def test_score_rescores_saved_samples(plugins, tmp_path, cli):
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in [
        {"response": "42", "answer": "42", "episode_id": "a"},
        {"response": "41", "answer": "42", "episode_id": "b"},
        {"response": " 42 ", "answer": "42", "episode_id": "c"},
    ]) + "\n")
    target = tmp_path / "scored.jsonl"
    proc = cli("score", "--verifier", "exact_match", "--input", str(source), "--output", str(target))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["lines"] == 3 and summary["correct"] == 2 and summary["accuracy"] == pytest.approx(2 / 3, 1e-4)
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["reward"] for r in rows] == [1.0, 0.0, 1.0]
    assert [r["episode_id"] for r in rows] == ["a", "b", "c"] and rows[1]["extracted"] == "41"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"response": "1"}\n')
    proc = cli("score", "--verifier", "exact_match", "--input", str(bad))
    assert proc.returncode == 1 and "bad.jsonl:1: each line needs 'response' and 'answer'" in proc.stderr


class ClosingController:
    """A controller outside the class hierarchy with a lifecycle: scaffold run starts and closes it."""

    events: list = []

    def __init__(self, fail_start: bool = False):
        self.fail_start = fail_start

    def clone(self):
        return ClosingController(self.fail_start)  # every episode its own object (the prototype is refused)

    async def start(self):
        ClosingController.events.append("start")
        if self.fail_start:
            raise RuntimeError("could not start the tool server")

    async def close(self):
        ClosingController.events.append("close")

    def process(self, ctx):
        from scaffold_core.episode import Outcome, Sample

        task = ctx.generation_task(0)
        yield [task]
        sample = Sample.from_task(task)
        return Outcome(samples=[sample])


class TurnsMaker:
    """A trajectory maker that adds columns of its own to every training sample."""

    def make(self, episode):
        from dataclasses import asdict

        from scaffold_core.builtins.trajectories import SingleTurnTrajectoryMaker

        out = []
        for t in SingleTurnTrajectoryMaker().make(episode):
            row = asdict(t)
            extra = {"turn_rewards": [0.0, t.reward], "turn_ends": [3, len(t.input_ids)], "note": "x",
                     "blob": {"not": "a column"}}
            out.append(type("Row", (), {"to_dict": lambda self, r={**row, **extra}: r})())
        return out


class LifecyclePlugin:
    @hookimpl
    def register_controllers(self, registry):
        registry.add("closing", ClosingController)

    @hookimpl
    def register_trajectory_makers(self, registry):
        registry.add("turns", TurnsMaker)


def test_run_starts_and_closes_the_controller_and_keeps_extra_trajectory_columns(tmp_path):
    plugins = plugin_set(numbers=Plugin(), lifecycle=LifecyclePlugin())
    ClosingController.events = []
    metrics, out = run(plugins, tmp_path, BASE + "controller: {name: closing}\ntrajectory: {name: turns}\n")
    assert metrics["completed"] == 6
    assert ClosingController.events == ["start", "close"]
    ds = datasets.load_from_disk(str(out / "trajectories"))
    assert ds[0]["turn_rewards"] == [0.0, 1.0] and ds[0]["turn_ends"][0] == 3 and ds[0]["note"] == "x"
    assert "blob" not in ds.column_names  # not a column type: kept in the store only
    ClosingController.events = []
    with pytest.raises(RuntimeError, match="could not start the tool server"):
        run(plugins, tmp_path, BASE + "controller: {name: closing, fail_start: true}\n", out="failed")
    assert ClosingController.events == ["start", "close"]  # a failed start is still closed
