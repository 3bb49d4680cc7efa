"""The derived files a run writes as its episodes finish (scaffold_core.output.live) and the join that puts
them in place (scaffold_core.output.join) give exactly what deriving them from the ledgers gives: one
process, stragglers, several workers; parts that do not cover the ledgers are never used."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import pytest

import scaffold_core.output.dataset as dataset_module
import scaffold_core.output.follower as follower_module
import scaffold_core.output.live as live_module
import scaffold_core.run.finalize as finalize_module
import scaffold_core.run.rollout as rollout_module
from scaffold_core.config import load_config
from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.output.derived import write_derived
from scaffold_core.output.join import join_parts
from scaffold_core.output.ledger import ledger_paths, packed_entry
from scaffold_core.output.live import LivePart
from scaffold_core.output.rundir import RunOutput
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


def refuse_add(*args, **kwargs):
    raise AssertionError("the part was written in the run's process")


CONFIGS = {
    "one sample": {"task": {"name": "arithmetic", "count": 300}},
    "majority vote, grpo": {"task": {"name": "arithmetic", "count": 120}, "controller": {"name": "majority_vote",
                                                                                         "samples": 4},
                            "trajectory": {"name": "grpo"}, "engine": {"logprob": -0.1234567}},
    "every episode failed": {"task": {"name": "arithmetic", "count": 30}, "engine": {"delay_s": 0.2},
                             "rollout": {"request_timeout": 0.01}},
}


@pytest.mark.parametrize("follow", [True, False], ids=["written by a follower", "written in the run's process"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_run_puts_the_files_it_wrote_as_it_went_in_place(test_plugins, tmp_path, monkeypatch, name, follow):
    monkeypatch.setattr(rollout_module, "spare_cores", lambda processes: follow)
    monkeypatch.setattr(rollout_module, "FOLLOW_MIN_EPISODES", 0)
    if follow:  # nothing of the part is written in this process
        monkeypatch.setattr(LivePart, "add", refuse_add)
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


# -- parts written by a process that follows the ledger ----------------------------------------------


def followed(root: Path, results: list[EpisodeResult]) -> RunOutput:
    """A run directory whose derived files a follower writes, fed ``results`` one write (one message) each."""
    out = RunOutput(root)
    out.start_live(True, follow=True)
    assert out.follower is not None and out.live is None
    for res in results:
        out.append(res)
    return out


def child_of(out: RunOutput) -> subprocess.Popen:
    assert out.follower is not None and out.follower._proc is not None
    return out.follower._proc


def exited(pid: int) -> bool:
    """Whether a process is gone (or a zombie no one reaps, as an orphan in a container may be)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status


def test_a_follower_writes_what_this_process_writes(tmp_path):
    results = [episode(i, turns=i >= 60) for i in range(150)]  # failed episodes, extra columns, stragglers
    late = results[:]
    for i in (5, 40, 41):
        late.remove(results[i])
        late.insert(i + 30, results[i])
    root = tmp_path / "run"
    out = followed(root, late[:100])
    out.deferred = True  # the rest as a run appends them: several episodes to a write
    for k in range(100, 150, 7):
        for res in late[k:k + 7]:
            out.append(res)
        out.flush()
    out.close()
    part = out.finish_live({"episodes": 150})
    out.release()
    assert part is not None
    manifest = json.loads((part / "part.json").read_text())
    assert (manifest["end"], manifest["metrics"]) == ((root / "episodes.jsonl").stat().st_size, {"episodes": 150})
    assert join_parts(root, [part], ledger_paths(root), save_dataset=True) is not None
    assert derived(root) == reference(tmp_path, results)


#: A run that appends failed episodes, told when to go on by a line on its input (as a run whose first
#: Ctrl-C or SIGTERM lets it finish what it has: the signals are ignored here).
SIGNALLED_RUN = """
import json, signal, sys
from scaffold_core.episode import EpisodeResult
from scaffold_core.output.rundir import RunOutput
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
out = RunOutput(sys.argv[1])
out.start_live(True, follow=True)
for i in range(10):
    out.append(EpisodeResult(f"e{i}", i, "failed", error="engine raised", error_component="engine"))
print(out.follower._proc.pid, flush=True)
sys.stdin.readline()
out.append(EpisodeResult("e10", 10, "failed", error="engine raised", error_component="engine"))
out.close()
print(out.finish_live({}), flush=True)
"""


def test_the_signals_a_run_stops_on_are_the_runs_not_its_followers(tmp_path):
    run = subprocess.Popen([sys.executable, "-c", SIGNALLED_RUN, str(tmp_path / "run")], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(run.stdout.readline())
        for sig in (signal.SIGINT, signal.SIGTERM):  # a terminal's Ctrl-C reaches the run's whole process group
            os.killpg(run.pid, sig)
        out, _ = run.communicate("go on\n", timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=30)
    assert run.returncode == 0 and exited(child)
    part = Path(out.strip())
    assert json.loads((part / "part.json").read_text())["segments"][0]["episodes"] == 11


def test_a_follower_goes_with_a_part_given_up(tmp_path):
    out = followed(tmp_path / "run", [episode(i) for i in range(10)])
    child = child_of(out)
    out.drop_live()  # the run failed: the ledger has everything
    assert child.returncode is not None and not list((tmp_path / "run").glob(".derived.*"))
    out.close()
    out.release()


@pytest.mark.parametrize("how", ["killed", "hung", "a damaged blob"])
def test_a_follower_that_fails_costs_its_part_only(tmp_path, monkeypatch, caplog, how):
    monkeypatch.setattr(follower_module, "FINISH_TIMEOUT_S", 2.0)
    results = [episode(i) for i in range(40)]
    root = tmp_path / "run"
    out = followed(root, results[:20])
    child = child_of(out)
    if how == "killed":
        child.kill()
        child.wait(timeout=30)
    else:
        os.kill(child.pid, signal.SIGSTOP)  # it reads nothing more until it continues
    damaged = out._tokens_size + 10  # in the next episode's blob
    for res in results[20:]:
        out.append(res)
    if how == "a damaged blob":
        with open(out.tokens_path, "r+b") as fh:
            fh.seek(damaged)
            fh.write(b"\xff\xfe")
        os.kill(child.pid, signal.SIGCONT)
    out.close()
    with caplog.at_level(logging.WARNING, logger="scaffold.output"):
        assert out.finish_live({}) is None
    out.release()
    message = {"killed": "stopped", "hung": "within 2 s", "a damaged blob": "damaged (CRC-32 differs)"}[how]
    assert message in caplog.text and "derived from the ledger" in caplog.text
    assert exited(child.pid) and not list(root.glob(".derived.*"))
    if how != "a damaged blob":  # the ledger has every episode: the files come from it
        finalize_run_dir(root, {}, hooks=Hooks(None))
        assert derived(root) == reference(tmp_path, results)


def test_a_follower_whose_run_dies_removes_its_part_and_exits(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / "episodes.jsonl").write_bytes(b"")
    script = ("import os, signal, sys\n"
              "from pathlib import Path\n"
              "from scaffold_core.output.follower import LedgerFollower\n"
              "root = Path(sys.argv[1])\n"
              "f = LedgerFollower(root, root / 'episodes.jsonl', True)\n"
              "while not list(root.glob('.derived.*')):\n"
              "    pass\n"
              "print(f._proc.pid, flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    run = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGKILL, run.stderr
    pid = int(run.stdout)
    deadline = time.monotonic() + 30
    while not exited(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exited(pid)
    assert not list(root.glob(".derived.*"))


def test_a_follower_takes_a_large_run_with_a_dataset_and_a_core_to_spare(test_plugins, tmp_path, monkeypatch):
    monkeypatch.setattr(rollout_module, "FOLLOW_MIN_EPISODES", 20)
    started = []
    monkeypatch.setattr(follower_module.LedgerFollower, "__init__",
                        lambda self, *a, **k: started.append(a) or (_ for _ in ()).throw(OSError("no fork")))
    data = {"task": {"name": "arithmetic", "count": 20}, "engine": {"name": "benchmark_canned"},
            "sampling": {"max_tokens": 8}, "rollout": {"progress": False}}
    cases = [({0, 1}, True, 20, 1), ({0}, True, 20, 0), ({0, 1}, False, 20, 0), ({0, 1}, True, 19, 0)]
    for cores, save_dataset, count, wanted in cases:
        started.clear()
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: cores)
        run = dict(data, task={"name": "arithmetic", "count": count}, output={"save_dataset": save_dataset})
        Rollout(load_config(data=run), output_dir=tmp_path / f"r{len(cores)}{save_dataset}{count}").run()
        assert len(started) == wanted  # a follower that cannot start leaves the files to this process
    assert (tmp_path / "r2True20" / "trajectories").is_dir()
