"""The derived files a run writes as its episodes finish (scaffold_core.output.live) and the join that puts
them in place (scaffold_core.output.join) give exactly what deriving them from the ledgers gives: one
process, stragglers, several workers; parts that do not cover the ledgers are never used."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import pytest

import scaffold_core.output.dataset as dataset_module
import scaffold_core.output.live as live_module
import scaffold_core.run.finalize as finalize_module
from scaffold_core.config import load_config
from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.output.derived import write_derived
from scaffold_core.output.join import join_parts
from scaffold_core.output.ledger import ledger_paths, packed_entry
from scaffold_core.output.live import LivePart
from scaffold_core.plugins.lifecycle import Hooks
from scaffold_core.run.finalize import finalize_run_dir
from scaffold_core.run.rollout import Rollout
from scaffold_core.trajectory import TrainingSample
from scaffold_core.verifier import Verdict

#: What a session measures itself (finalize takes it from the live metrics), and the output folder.
CLOCK = {*finalize_module.SESSION_KEYS, "output_dir", "session"}
DERIVED = ("samples.jsonl", "failures.jsonl", "trajectories", "metrics.json")


def contents(directory: Path) -> dict:
    """samples and failures byte for byte, the dataset's features and rows, the metrics without clocks."""
    out: dict = {name: (directory / name).read_bytes() for name in ("samples.jsonl", "failures.jsonl")}
    ds = datasets.load_from_disk(str(directory / "trajectories"))
    out["dataset"] = (ds.features.to_dict(), ds.to_list())
    metrics = json.loads((directory / "metrics.json").read_text())
    out["metrics"] = {k: v for k, v in metrics.items() if k not in CLOCK}
    return out


def derived_from_the_ledgers(directory: Path, copy: Path) -> dict:
    """The same run directory's files derived again from its ledgers alone (no parts)."""
    shutil.copytree(directory, copy)
    for name in DERIVED:
        target = copy / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    finalize_run_dir(copy, {}, hooks=Hooks(None))
    return contents(copy)


CONFIGS = {
    "one sample": {"task": {"name": "arithmetic", "count": 300}},
    "majority vote, grpo": {"task": {"name": "arithmetic", "count": 120}, "controller": {"name": "majority_vote",
                                                                                         "samples": 4},
                            "trajectory": {"name": "grpo"}, "engine": {"logprob": -0.1234567}},
    "every episode failed": {"task": {"name": "arithmetic", "count": 30}, "engine": {"delay_s": 0.2},
                             "rollout": {"request_timeout": 0.01}},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_run_puts_the_files_it_wrote_as_it_went_in_place(test_plugins, tmp_path, monkeypatch, name):
    data = json.loads(json.dumps(CONFIGS[name]))
    data["engine"] = {"name": "benchmark_canned", "response": "so it is #### 42", **data.get("engine", {})}
    data.setdefault("sampling", {})["max_tokens"] = 16
    data.setdefault("rollout", {}).update(progress=False, concurrency=16)

    def refuse(*args, **kwargs):
        raise AssertionError("the files were derived from the ledger: the run's part was not used")

    monkeypatch.setattr(finalize_module, "_derive", refuse)
    Rollout(load_config(data=data), output_dir=tmp_path / "run").run()
    monkeypatch.undo()
    assert not list((tmp_path / "run").glob(".derived.*"))  # the part folder is gone
    assert contents(tmp_path / "run") == derived_from_the_ledgers(tmp_path / "run", tmp_path / "again")


# -- parts written from records directly -------------------------------------------------------------


@dataclass(slots=True)
class TurnSample(TrainingSample):
    turn_rewards: list[float] = field(default_factory=list)


def episode(i: int, turns: bool = False) -> EpisodeResult:
    eid = f"e{i:04d}"
    if i % 7 == 3:
        return EpisodeResult(eid, i, "failed", reference="42", prompt_text=f"Q{i}", error=f"engine raised in {eid}",
                             error_component="engine")
    n = 2 + i % 5
    ids = [i % 251 + 3 * k for k in range(n + 3)]
    sample = Sample(ids[:3], ids[3:], [-0.5] * n, [1] * n, f"it is {i}", "stop", 0, 0,
                    Verdict(float(i % 2), str(i), str(i), "match"))
    cls, extra = (TurnSample, {"turn_rewards": [0.5, float(i)]}) if turns else (TrainingSample, {})
    traj = cls(ids, [0] * 3 + [1] * n, [0.0] * 3 + [-0.5] * n, [-1] * 3 + [0] * n, float(i % 2), 0.0, eid, 0, eid,
               3, "stop", **extra)
    return EpisodeResult(eid, i, "ok", reference="42", prompt_text=f"Q{i}", samples=[sample], trajectories=[traj])


def write_run(root: Path, shards: dict[str, list[EpisodeResult]], save_dataset: bool = True,
              start: dict[str, int] | None = None) -> list[Path]:
    """Ledgers and sidecars as workers append them (in the given order), each fed to a part as it goes."""
    root.mkdir(parents=True, exist_ok=True)
    folders = []
    for rank, (name, results) in enumerate(shards.items()):
        part = LivePart(root, save_dataset, first=rank, step=len(shards))
        lines, blobs = [], b""
        for res in results:
            line, blob, record = packed_entry(res, len(blobs))
            lines.append(line)
            blobs += blob
            part.add(record, blob)
        (root / name).write_bytes(b"".join(lines))
        (root / name.replace(".jsonl", ".tokens.bin")).write_bytes(blobs)
        size = (root / name).stat().st_size
        folders.append(part.finish(ledger=name, start=(start or {}).get(name, 0), end=size, metrics={}))
    return folders


def derived(directory: Path) -> dict:
    out: dict = {name: (directory / name).read_bytes() for name in ("samples.jsonl", "failures.jsonl")}
    if (directory / "trajectories").exists():
        ds = datasets.load_from_disk(str(directory / "trajectories"))
        out["dataset"] = (ds.features.to_dict(), ds.to_list())
    return out


def reference(tmp_path: Path, results: list[EpisodeResult], save_dataset: bool = True) -> dict:
    """The files write_derived makes from every record, in (index, episode_id) order."""
    root = tmp_path / "reference"
    root.mkdir()
    records = {}
    for res in results:
        line, blob, record = packed_entry(res, 0)
        records[res.episode_id] = (record, blob)
    ordered = [records[k] for k in sorted(records, key=lambda k: (records[k][0]["index"], k))]
    write_derived(root, lambda: ordered, save_dataset=save_dataset)
    return derived(root)


@pytest.mark.parametrize("layout", ["in order", "stragglers", "two workers", "three workers, shuffled"])
@pytest.mark.parametrize("save_dataset", [True, False])
def test_parts_are_joined_into_what_the_records_give(tmp_path, monkeypatch, layout, save_dataset):
    monkeypatch.setattr(live_module, "WINDOW", 8)  # stragglers beyond 8 start segments
    monkeypatch.setattr(dataset_module, "CHUNK_ROWS", 16)
    results = [episode(i) for i in range(200)]
    rng = random.Random(7)
    if layout == "in order":
        shards = {"episodes.jsonl": results}
    elif layout == "stragglers":
        late = results[:]
        for i in (5, 40, 41, 120):  # these finish long after the others
            late.remove(results[i])
            late.insert(min(len(late), i + 30), results[i])
        shards = {"episodes.jsonl": late}
    else:
        workers = 2 if layout == "two workers" else 3
        shards = {f"episodes.rank-{r:05d}.jsonl": [x for x in results if x.index % workers == r]
                  for r in range(workers)}
        if layout.endswith("shuffled"):
            for name in shards:
                rng.shuffle(shards[name])
    root = tmp_path / "run"
    parts = write_run(root, shards, save_dataset)
    manifests = join_parts(root, parts, ledger_paths(root), save_dataset=save_dataset)
    assert manifests is not None
    segments = sum(len(m["segments"]) for m in manifests)
    assert (segments == 1) == (layout == "in order")
    assert derived(root) == reference(tmp_path, results, save_dataset)


def test_parts_that_do_not_cover_the_ledgers_are_not_used(tmp_path):
    results = [episode(i) for i in range(40)]
    root = tmp_path / "run"
    parts = write_run(root, {"episodes.jsonl": results})
    ledger = root / "episodes.jsonl"
    with ledger.open("ab") as fh:  # a line another session appended (a resume, a second writer)
        fh.write(packed_entry(episode(99), 0)[0])
    assert join_parts(root, parts, [ledger], save_dataset=True) is None
    assert not (root / "samples.jsonl").exists()  # nothing was written
    (root / "other.jsonl").write_bytes(b"")
    other = write_run(tmp_path / "b", {"episodes.rank-00000.jsonl": results[:10]})
    assert join_parts(tmp_path / "b", other, ledger_paths(tmp_path / "b") + [ledger], save_dataset=True) is None
    resumed = write_run(tmp_path / "c", {"episodes.jsonl": results}, start={"episodes.jsonl": 5})
    assert join_parts(tmp_path / "c", resumed, ledger_paths(tmp_path / "c"), save_dataset=True) is None


def test_an_episode_twice_is_left_to_the_ledgers(tmp_path):
    results = [episode(i) for i in range(30)] + [episode(4)]  # a duplicate id (two rows with one id)
    root = tmp_path / "run"
    parts = write_run(root, {"episodes.jsonl": results})
    assert join_parts(root, parts, ledger_paths(root), save_dataset=True) is None


def test_extra_columns_that_change_after_the_first_chunk_are_derived_from_the_ledger(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_module, "CHUNK_ROWS", 16)
    results = [episode(i, turns=i >= 50) for i in range(80)]  # turn_rewards appear after the first chunk
    root = tmp_path / "run"
    parts = write_run(root, {"episodes.jsonl": results})
    assert join_parts(root, parts, ledger_paths(root), save_dataset=True) is None  # its dataset went stale
    finalize_run_dir(root, {}, hooks=Hooks(None), parts=parts)
    assert not list(root.glob(".derived.*"))
    got = derived(root)
    assert got == reference(tmp_path, results)
    features, rows = got["dataset"]
    by_id = {row["episode_id"]: row for row in rows}
    assert "turn_rewards" in features and by_id["e0060"]["turn_rewards"] == [0.5, 60.0]
    assert by_id["e0000"]["turn_rewards"] is None


@pytest.mark.parametrize("workers", [1, 2])
def test_extra_columns_from_the_first_row_on_are_joined_from_the_parts(tmp_path, workers):
    results = [episode(i, turns=True) for i in range(60)]  # a multi-turn run: turn_rewards in every row
    root = tmp_path / "run"
    shards = {f"episodes.rank-{r:05d}.jsonl" if workers > 1 else "episodes.jsonl":
              [x for x in results if x.index % workers == r] for r in range(workers)}
    parts = write_run(root, shards)
    assert join_parts(root, parts, ledger_paths(root), save_dataset=True) is not None
    got = derived(root)
    assert got == reference(tmp_path, results)
    assert "turn_rewards" in got["dataset"][0]


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
    assert contents(tmp_path / "two") == contents(tmp_path / "one")
    assert not list((tmp_path / "two").glob(".derived.*"))
