"""The files exported from the run's store (samples, failures, the trajectories dataset, metrics) are what the
records give, whatever order the episodes finished in, however many workers wrote them, whether the dataset is
written by a process of its own; a record keeps the content ``json`` would write."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import pytest

import scaffold_core.output.export as export_module
import scaffold_core.run.finalize as finalize_module
from scaffold_core.config import load_config
from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.output import codec, read_records
from scaffold_core.output.export import ExportProcess, trajectory_features
from scaffold_core.output.store import EpisodeStore, record_of, result_of, store_paths
from scaffold_core.plugins.lifecycle import Hooks
from scaffold_core.run.finalize import finalize_run_dir
from scaffold_core.run.metrics import RunMetrics
from scaffold_core.run.rollout import Rollout
from scaffold_core.trajectory import TrainingSample
from scaffold_core.verifier import Verdict

#: What a session measures itself, and the output folder.
# clock readings: the session's, and where the episodes' time went (spans)
CLOCK = {*finalize_module.SESSION_KEYS, "output_dir", "session", "episode_time_s", "time_shares"}


def as_json(text: bytes | str):
    """Parsed with the standard library, NaN kept comparable (NaN != NaN)."""
    return json.loads(text, parse_constant=lambda name: f"<{name}>")


@dataclass(slots=True)
class TurnSample(TrainingSample):
    turn_rewards: list[float] = field(default_factory=list)


def training(cls=TrainingSample, **changes):
    fields = dict(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25], versions=[-1, 0, 0],
                  reward=1.0, advantage=0.5, episode_id="e", sample_index=0, group_id="e", prompt_len=1,
                  finish_reason="stop")
    return cls(**{**fields, **changes})


def row(**changes):
    sample = training()
    return {**{name: getattr(sample, name) for name in TrainingSample.__slots__}, **changes}


def result(eid="e", index=0, status="ok", trajectories=None, metadata=None, reward=1.0, metrics=None):
    sample = Sample([1], [2, 3], [-0.5, -0.25], [1, 1], "so 42", "stop", 0, 0,
                    Verdict(reward, "42", "42", "match"), metadata=metadata or {})
    return EpisodeResult(eid, index, status, reference="42", prompt_text="Q?",
                         samples=[sample] if status == "ok" else [], metrics=metrics or {},
                         error=None if status == "ok" else "engine raised",
                         error_component=None if status == "ok" else "engine",
                         trajectories=[training()] if trajectories is None else trajectories)


# -- the exported files are what the records give ------------------------------------------------------------
def episode(i: int, turns: bool = False, status: str | None = None, reward: float | None = None,
            tokens: int = 0) -> EpisodeResult:
    eid = f"e{i:04d}"
    if status == "failed" or (status is None and i % 7 == 3):
        return EpisodeResult(eid, i, "failed", reference="42", prompt_text=f"Q{i}", error=f"engine raised in {eid}",
                             error_component="engine")
    n = 2 + i % 5 + tokens
    ids = [i % 251 + 3 * k for k in range(n + 3)]
    reward = float(i % 2) if reward is None else reward
    sample = Sample(ids[:3], ids[3:], [-0.5] * n, [1] * n, f"it is {i}", "stop", 0, 0,
                    Verdict(reward, str(i), str(i), "match"))
    cls, extra = (TurnSample, {"turn_rewards": [0.5, float(i)]}) if turns else (TrainingSample, {})
    traj = cls(ids, [0] * 3 + [1] * n, [0.0] * 3 + [-0.5] * n, [-1] * 3 + [0] * n, reward, 0.0, eid, 0, eid,
               3, "stop", **extra)
    return EpisodeResult(eid, i, "ok", reference="42", prompt_text=f"Q{i}", samples=[sample], trajectories=[traj],
                         metrics={"maj@1": reward})


def write_stores(root: Path, stores: dict[str, list[EpisodeResult]]) -> Path:
    """Stores as a run's processes write them: each episode in its own step, in the order given."""
    root.mkdir(parents=True, exist_ok=True)
    for name, results in stores.items():
        store = EpisodeStore(root / name)
        try:
            for res in results:
                store.put([res])
        finally:
            store.close()
    return root


def expected(results: list[EpisodeResult], save_dataset: bool = True) -> dict:
    """What the files must hold, made from the records with the standard library and ``datasets``: each
    episode's latest record (a completed one beats a failed one), in ``(index, episode_id)`` order."""
    latest: dict[str, dict] = {}
    for res in results:
        old = latest.get(res.episode_id)
        if old is None or res.status == "ok" or old["status"] != "ok":
            latest[res.episode_id] = record_of(res)
    ordered = sorted(latest.values(), key=lambda r: (r["index"], r["episode_id"]))
    samples, failures, rows = [], [], []
    for r in ordered:
        if r["status"] != "ok":
            failures.append({k: r[k] for k in ("episode_id", "index", "error_component", "error", "attempts",
                                               "answer")})
            continue
        for s in r["samples"]:
            samples.append({"episode_id": r["episode_id"], "sample_index": s["sample_index"], "prompt": r["prompt"],
                            "response": s["response"], "answer": r["answer"], "extracted": s["extracted"],
                            "reward": s["reward"], "reason": s["reason"], "finish_reason": s["finish_reason"],
                            "generated_tokens": s["generated_tokens"],
                            "chosen": r["chosen"] == s["sample_index"] if r["chosen"] is not None else None})
        rows += r["trajectories"]
    out: dict = {"samples.jsonl": samples, "failures.jsonl": failures}
    if save_dataset:
        features = trajectory_features()
        if any("turn_rewards" in t for t in rows):
            features["turn_rewards"] = datasets.Sequence(datasets.Value("float32"))
        ds = datasets.Dataset.from_dict({name: [t.get(name) for t in rows] for name in features}, features=features)
        out["dataset"] = (ds.features.to_dict(), ds.to_list())
    totals = RunMetrics()
    for r in ordered:
        totals.add(result_of(r))
    out["metrics"] = {k: v for k, v in totals.summary().items() if k not in CLOCK}
    return out


def exported(directory: Path, metrics: dict) -> dict:
    out: dict = {name: [as_json(line) for line in (directory / name).read_text().splitlines()]
                 for name in ("samples.jsonl", "failures.jsonl")}
    if (directory / "trajectories").exists():
        ds = datasets.load_from_disk(str(directory / "trajectories"))
        out["dataset"] = (ds.features.to_dict(), ds.to_list())
    out["metrics"] = {k: v for k, v in metrics.items() if k not in CLOCK}
    return out


def retried(results: list[EpisodeResult]) -> list[EpisodeResult]:
    """Failed attempts before the records, and a completed episode failing again after (resumed runs)."""
    out = []
    for res in results:
        if res.index % 5 == 1:
            out.append(episode(res.index, status="failed"))
        out.append(res)
        if res.index % 11 == 2 and res.status == "ok":
            out.append(episode(res.index, status="failed"))
    return out


LAYOUTS = ["in order", "stragglers", "two workers, shuffled", "retries and resumes", "extra columns",
           "long sequences", "one index, several ids"]


def layout(name: str) -> tuple[dict[str, list[EpisodeResult]], list[EpisodeResult]]:
    results = [episode(i, turns=name == "extra columns", tokens=3000 if name == "long sequences" else 0)
               for i in range(60 if name == "long sequences" else 200)]
    if name == "stragglers":
        late = results[:]
        for i in (5, 40, 41, 120):  # these finish long after the others
            late.remove(results[i])
            late.insert(min(len(late), i + 30), results[i])
        return {"episodes.db": late}, results
    if name == "two workers, shuffled":
        shards = {f"episodes.rank-{r:05d}.db": [x for x in results if x.index % 2 == r] for r in range(2)}
        for shard in shards.values():
            random.Random(7).shuffle(shard)
        shards["episodes.rank-00000.db"].append(episode(1, status="failed"))  # rank 1 completed it meanwhile
        return shards, [*results, episode(1, status="failed")]
    if name == "retries and resumes":
        return {"episodes.db": retried(results)}, retried(results)
    if name == "one index, several ids":
        twins = [EpisodeResult(f"k{i}", 5, "ok", samples=[], prompt_text="twin") for i in (3, 1, 2)]
        return {"episodes.db": results + twins}, results + twins
    return {"episodes.db": results}, results


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("apart", [False, True, "follow"], ids=["in this process", "dataset in a process of its own",
                                                                "everything by a process told as rows are final"])
def test_the_exported_files_are_what_the_records_give(tmp_path, monkeypatch, caplog, name, apart):
    monkeypatch.setattr(export_module, "CHUNK_ROWS", 16)  # many chunks, a few rows each
    monkeypatch.setattr(export_module, "FOLLOW_ROWS", 1)  # each mark is written at once
    monkeypatch.setattr(finalize_module, "EXPORT_PROCESS_EPISODES", 0 if apart is True else 1 << 60)
    monkeypatch.setattr(finalize_module, "usable_cores", lambda: 2)
    stores, results = layout(name)
    root = write_stores(tmp_path / "run", stores)
    follower = None
    if apart == "follow":  # two workers' stores: a merge at the end, the process stopped, this one exports
        follower = ExportProcess(root, store_paths(root), dataset=True, parquet=False, private=True)
        for mark in (0, 3, 50, 50, 7, 120, 199):
            follower.mark(mark)
    heads = []
    with caplog.at_level(logging.WARNING, logger="scaffold.output"):
        metrics = finalize_run_dir(root, {}, hooks=Hooks(None), follower=follower, on_head=heads.append)
    assert "exporting it here" not in caplog.text  # a process that was asked to wrote them
    assert exported(root, metrics) == expected(results)
    assert [h["episode_id"] for h in heads] == [r["episode_id"] for r in read_records(root)]
    assert sorted(p.name for p in root.iterdir()) == ["episodes.db", "failures.jsonl", "metrics.json",
                                                       "samples.jsonl", "trajectories"]


def test_without_a_dataset_only_samples_failures_and_metrics_are_written(tmp_path):
    stores, results = layout("retries and resumes")
    root = write_stores(tmp_path / "run", stores)
    metrics = finalize_run_dir(root, {}, hooks=Hooks(None), save_dataset=False)
    assert exported(root, metrics) == expected(results, save_dataset=False)
    assert not (root / "trajectories").exists()


@pytest.mark.parametrize("follow", [False, True], ids=["in this process", "by a process told as rows are final"])
def test_extra_columns_that_appear_after_the_first_chunk_are_in_every_row(tmp_path, monkeypatch, caplog, follow):
    monkeypatch.setattr(export_module, "CHUNK_ROWS", 16)  # this process's chunks; the other process's hold 256
    monkeypatch.setattr(export_module, "FOLLOW_ROWS", 1)
    results = [episode(i, turns=i >= 500) for i in range(600)]  # turn_rewards appear after the first chunk
    root = write_stores(tmp_path / "run", {"episodes.db": results})
    follower = None
    if follow:
        follower = ExportProcess(root, store_paths(root), dataset=True, parquet=False, private=True)
        for mark in (100, 400, 550):
            follower.mark(mark)
    with caplog.at_level(logging.WARNING, logger="scaffold.output"):
        metrics = finalize_run_dir(root, {}, hooks=Hooks(None), follower=follower)
    assert "exporting it here" not in caplog.text
    got = exported(root, metrics)
    assert got == expected(results)
    features, rows = got["dataset"]
    by_id = {row["episode_id"]: row for row in rows}
    assert "turn_rewards" in features and by_id["e0501"]["turn_rewards"] == [0.5, 501.0]
    assert by_id["e0000"]["turn_rewards"] is None
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]  # no temp left behind


def test_a_dataset_process_that_fails_costs_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(export_module, "_CHILD", "import sys; sys.exit('no room for the dataset')")
    monkeypatch.setattr(finalize_module, "EXPORT_PROCESS_EPISODES", 0)
    monkeypatch.setattr(finalize_module, "usable_cores", lambda: 2)
    stores, results = layout("in order")
    root = write_stores(tmp_path / "run", stores)
    with caplog.at_level(logging.WARNING, logger="scaffold.output"):
        metrics = finalize_run_dir(root, {}, hooks=Hooks(None))
    assert "the process exporting the run failed (exit status 1: no room for the dataset)" in caplog.text
    assert exported(root, metrics) == expected(results)


def test_a_process_told_rows_are_final_writes_them_before_the_end_and_one_that_fails_costs_nothing(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(export_module, "FOLLOW_ROWS", 1)
    stores, results = layout("retries and resumes")
    root = write_stores(tmp_path / "run", stores)
    follower = ExportProcess(root, store_paths(root), dataset=True, parquet=False, private=True)
    follower.mark(100)
    temp = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the samples of episodes 0-99 are written before the run ends
        temp = next(root.glob(".samples.jsonl.*"), None)
        if temp is not None and temp.stat().st_size and \
                json.loads(temp.read_text().splitlines()[-1])["episode_id"] == "e0099":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the samples of the episodes marked were not written: {temp}")
    metrics = finalize_run_dir(root, {}, hooks=Hooks(None), follower=follower)
    assert exported(root, metrics) == expected(results)
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]  # its temp files are in place

    monkeypatch.setattr(export_module, "_CHILD", "import sys; sys.exit('no room for the files')")
    shutil.rmtree(root)
    root = write_stores(tmp_path / "run", stores)
    follower = ExportProcess(root, store_paths(root), dataset=True, parquet=False, private=True)
    follower.mark(100)  # a process that is gone: nothing waits
    with caplog.at_level(logging.WARNING, logger="scaffold.output"):
        metrics = finalize_run_dir(root, {}, hooks=Hooks(None), follower=follower)
    assert "the process exporting the run failed (exit status 1: no room for the files)" in caplog.text
    assert exported(root, metrics) == expected(results)


def test_a_process_with_a_long_plan_and_no_dataset_writes_samples_and_failures(tmp_path, monkeypatch, caplog):
    """A plan longer than a pipe holds (many stores in a deep folder: written in parts), and no dataset."""
    monkeypatch.setattr(export_module, "FOLLOW_ROWS", 1)
    results = [episode(i) for i in range(320)]
    root = write_stores(tmp_path.joinpath(*["deep-" * 30] * 2) / "run",  # within SQLite's longest path
                        {f"episodes.rank-{r:05d}.db": results[r::160] for r in range(160)})
    paths = store_paths(root)
    assert len(json.dumps([str(p) for p in paths])) > 65536  # more than a pipe's buffer
    follower = ExportProcess(root, paths, dataset=False, parquet=False, private=True)
    follower.mark(60)
    with caplog.at_level(logging.WARNING, logger="scaffold.output"):
        export_module.export_run(root, paths, save_dataset=False, follower=follower)
    assert "exporting it here" not in caplog.text  # the process wrote them
    out = exported(root, {})
    want = expected(results, save_dataset=False)
    assert (out["samples.jsonl"], out["failures.jsonl"]) == (want["samples.jsonl"], want["failures.jsonl"])
    assert not (root / "trajectories").exists()


FOLLOWED = """
import os, sys
from pathlib import Path
from scaffold_core.output.export import ExportProcess
root = Path(sys.argv[1])
follower = ExportProcess(root, [root / "episodes.db"], dataset=True, parquet=False, private=True)
follower.mark(150)
print(follower.proc.pid, flush=True)
os.kill(os.getpid(), 9)
"""


def test_the_export_process_of_a_killed_run_stops_and_leaves_no_file(tmp_path):
    stores, _ = layout("in order")
    root = write_stores(tmp_path / "run", stores)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                       os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", FOLLOWED, str(root)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == -9, proc.stderr
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and \
            "Z" not in (Path(f"/proc/{pid}/stat").read_text().split()[2:3] or ["Z"]):
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    assert sorted(p.name for p in root.iterdir()) == ["episodes.db"]  # no exported file, no temp left


def test_the_parquet_file_has_the_datasets_rows(tmp_path):
    import pyarrow.parquet as pq

    stores, results = layout("extra columns")
    root = write_stores(tmp_path / "run", stores)
    finalize_run_dir(root, {}, hooks=Hooks(None), save_parquet=True)
    parquet = datasets.load_dataset("parquet", data_files=str(root / "trajectories.parquet"), split="train",
                                    cache_dir=str(tmp_path / "cache"))
    saved = datasets.load_from_disk(str(root / "trajectories"))
    assert parquet.to_list() == saved.to_list()
    assert pq.ParquetFile(root / "trajectories.parquet").schema_arrow == saved.data.schema


# -- runs ----------------------------------------------------------------------------------------------------
CONFIGS = {
    "one sample": {"task": {"name": "arithmetic", "count": 300}},
    "majority vote, grpo": {"task": {"name": "arithmetic", "count": 120}, "controller": {"name": "majority_vote",
                                                                                         "samples": 4},
                            "trajectory": {"name": "grpo"}, "engine": {"logprob": -0.1234567}},
    "every episode failed": {"task": {"name": "arithmetic", "count": 30}, "engine": {"delay_s": 0.2},
                             "rollout": {"request_timeout": 0.01}},
}


def contents(directory: Path) -> dict:
    """samples and failures byte for byte, the dataset's features and rows, the metrics without clocks."""
    out: dict = {name: (directory / name).read_bytes() for name in ("samples.jsonl", "failures.jsonl")}
    ds = datasets.load_from_disk(str(directory / "trajectories"))
    out["dataset"] = (ds.features.to_dict(), ds.to_list())
    metrics = json.loads((directory / "metrics.json").read_text())
    out["metrics"] = {k: v for k, v in metrics.items() if k not in CLOCK}
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_runs_totals_are_those_of_its_store(test_plugins, tmp_path, name):
    """A fresh run's metrics come from what its session counted; they are what the store gives."""
    data = json.loads(json.dumps(CONFIGS[name]))
    data["engine"] = {"name": "benchmark_canned", "response": "so it is #### 42", **data.get("engine", {})}
    data.setdefault("sampling", {})["max_tokens"] = 16
    data.setdefault("rollout", {}).update(progress=False, concurrency=16)
    Rollout(load_config(data=data), output_dir=tmp_path / "run").run()
    again = tmp_path / "again"
    shutil.copytree(tmp_path / "run", again)
    finalize_run_dir(again, {}, hooks=Hooks(None))  # no session: every total from the store
    assert contents(tmp_path / "run") == contents(again)


def test_two_workers_write_what_one_process_writes(test_plugins, tmp_path):
    from scaffold_core.launch import run_workers

    data = {"task": {"name": "arithmetic", "count": 60}, "engine": {"name": "benchmark_canned"},
            "sampling": {"max_tokens": 16}, "rollout": {"progress": False, "concurrency": 8}}
    Rollout(load_config(data=data), output_dir=tmp_path / "one").run()
    two = json.loads(json.dumps(data))
    two["rollout"]["workers"] = 2
    two["output"] = {"dir": str(tmp_path / "two")}
    metrics = run_workers(load_config(data=two))
    assert "worker_failures" not in metrics
    two_files, one_files = contents(tmp_path / "two"), contents(tmp_path / "one")
    differ = {k: (two_files["metrics"].get(k), one_files["metrics"].get(k))
              for k in {*two_files["metrics"], *one_files["metrics"]}
              if two_files["metrics"].get(k) != one_files["metrics"].get(k)}
    assert not differ, f"metrics of two workers (first) and of one process differ: {differ}"
    assert two_files == one_files
    assert sorted(r["episode_id"] for r in read_records(tmp_path / "two")) == \
        sorted(r["episode_id"] for r in read_records(tmp_path / "one"))


# -- the dataset's columns -----------------------------------------------------------------------------------
def test_the_trajectories_dataset_has_the_rows_and_types_from_dict_gives(tmp_path):
    rows = [
        row(),
        row(reward=1, prompt_len=2.9, logprobs=[0, -1, -2], group_id=5),  # values that encoding converts
        row(input_ids=["4", "5", "6"]),
    ]
    results = []
    for i, fields in enumerate(rows):
        res = result(f"e{i}", i, trajectories=[])
        res.trajectories = [_Row(fields)]
        results.append(res)
    root = write_stores(tmp_path / "run", {"episodes.db": results})
    finalize_run_dir(root, {}, hooks=Hooks(None))
    ours = datasets.load_from_disk(str(root / "trajectories"))
    features = trajectory_features()
    theirs = datasets.Dataset.from_dict({name: [row.get(name) for row in rows] for name in features},
                                        features=features)
    assert ours.features == theirs.features and ours.to_list() == theirs.to_list()
    state = json.loads((root / "trajectories" / "state.json").read_text())
    assert state["_data_files"] == [{"filename": "data-00000-of-00001.arrow"}]


class _Row:
    """A training sequence whose ``to_dict`` gives the fields as they are."""

    def __init__(self, fields: dict):
        self.fields = fields

    def to_dict(self) -> dict:
        return dict(self.fields)


@pytest.mark.parametrize("status", ["none", "failed"])
def test_a_run_without_training_rows_still_writes_a_loadable_dataset(tmp_path, status):
    """No episodes, or only failed ones: trajectories/ loads as an empty dataset with the standard columns."""
    failed = EpisodeResult(episode_id="e0", index=0, status="failed", error="engine down", error_component="engine")
    write_stores(tmp_path, {"episodes.db": [failed] if status == "failed" else []})
    metrics = finalize_run_dir(tmp_path, {}, hooks=Hooks(None))
    loaded = datasets.load_from_disk(str(tmp_path / "trajectories"))
    assert len(loaded) == 0 and {"input_ids", "loss_mask", "logprobs", "versions"} <= set(loaded.column_names)
    assert metrics["episodes"] == (1 if status == "failed" else 0)


def test_unicode_line_breaks_in_text_never_split_a_jsonl_line(tmp_path):
    """NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR in a response are escaped: line readers see one line each."""
    text = "a\u2028b\x85c\u2029d"
    sample = Sample([1], [2], [-0.5], [1], text, "stop", 0, 0, Verdict(1.0, text, text, "match"))
    res = EpisodeResult(episode_id="e0", index=0, status="ok", reference=text, samples=[sample])
    write_stores(tmp_path, {"episodes.db": [res]})
    finalize_run_dir(tmp_path, {}, hooks=Hooks(None), save_dataset=False)
    samples = (tmp_path / "samples.jsonl").read_text(encoding="utf-8")
    assert len(samples.splitlines()) == 1 and json.loads(samples)["response"] == text
    assert codec.loads(samples)["answer"] == text
