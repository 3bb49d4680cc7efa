"""rollout.launcher: ray: the same workers as Ray actors (on a local Ray instance here)."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from scaffold_core.config import load_config
from scaffold_core.launch import run_workers
from scaffold_core.launch.ray import _fetch_store, local_ranks

ROWS = [{"id": f"r{i}", "question": f"question {i}", "answer": "42" if i % 2 else "no"} for i in range(6)]


@pytest.fixture(autouse=True)
def ray_tmpdir(monkeypatch):
    """Ray keeps its session folder (logs, sockets) in RAY_TMPDIR; its sockets need a short path."""
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    yield
    shutil.rmtree(ray_tmp, ignore_errors=True)



def test_local_ranks_follow_the_nodes():
    assert local_ranks(["a", "b", "a", "a", "b"]) == [(0, 3), (0, 2), (1, 3), (2, 3), (1, 2)]


def test_an_unshared_store_is_copied_from_the_actor(tmp_path):
    remote = tmp_path / "node-b"
    remote.mkdir()
    (remote / "episodes.rank-00001.db").write_bytes(b'{"a": 1}\n' * 1000)
    local = tmp_path / "driver"
    local.mkdir()

    class FakeRay:
        @staticmethod
        def get(value, timeout=None):
            return value

    class FakeActor:
        class read_chunk:
            @staticmethod
            def remote(path, offset, size):
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    return fh.read(min(size, 777))  # several chunks

    path = remote / "episodes.rank-00001.db"
    _fetch_store(FakeRay, FakeActor, str(path), path.stat().st_size, local)
    assert (local / path.name).read_bytes() == path.read_bytes()


def test_ray_launcher_runs_the_config_on_2_actors(test_plugins, tmp_path):
    ray = pytest.importorskip("ray")
    data = {
        "task": {"name": "list", "rows": ROWS},
        "engine": {"name": "benchmark_canned", "response": "42"},
        "sampling": {"max_tokens": 8},
        "rollout": {"workers": 2, "launcher": "ray", "ray_num_cpus": 0.5, "ray_startup_timeout": 120,
                    "worker_timeout": 300, "progress": False},
        "output": {"dir": str(tmp_path / "ray"), "save_dataset": False},
    }
    metrics = run_workers(load_config(data=data))
    assert not ray.is_initialized()  # the local instance it started is stopped again
    assert "worker_failures" not in metrics, metrics.get("worker_failures")
    assert metrics["episodes"] == 6 and metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["workers"]["launcher"] == "ray" and metrics["workers"]["count"] == 2
    out = Path(tmp_path / "ray")
    ids = sorted(json.loads(line)["episode_id"] for line in (out / "samples.jsonl").read_text().splitlines())
    assert ids == sorted(r["id"] for r in ROWS)
    with contextlib.closing(sqlite3.connect(out / "episodes.db")) as db:  # the actors' stores, merged in rank order
        indices = [i for (i,) in db.execute("SELECT idx FROM episodes ORDER BY seq")]
    assert sorted(indices[:3]) == [0, 2, 4] and sorted(indices[3:]) == [1, 3, 5]


def test_a_failed_actor_is_reported_by_rank_and_shard(tmp_path):
    from scaffold_core.launch import merge_live
    from scaffold_core.launch.ray import _collect

    (tmp_path / "episodes.rank-00000.db").write_bytes(b"")

    class ActorDied(Exception):
        pass

    class FakeRay:
        @staticmethod
        def wait(refs, timeout=None):
            return refs, []

        @staticmethod
        def get(ref, timeout=None):
            if ref == "rank-1":
                raise ActorDied("The actor died unexpectedly before finishing this task (worker exit code 3)")
            return {"live": {"episodes": 3, "completed": 3, "failed": 0, "generated_tokens": 9, "wall_s": 1.0},
                    "store": str(tmp_path / "episodes.rank-00000.db"), "size": 0}

    results = _collect(FakeRay, {0: "rank-0", 1: "rank-1"}, [None, None], tmp_path, 2, None)
    live = merge_live(results)
    failure, = live["worker_failures"]
    assert failure["rank"] == 1 and failure["error"] == "ActorDied" and "index % 2 == 1" in failure["shard"]
    assert "worker exit code 3" in failure["log_tail"]
    assert live["episodes"] == 3


def test_actors_past_worker_timeout_are_reported_as_timed_out(tmp_path):
    from scaffold_core.launch.ray import _collect, _wait

    class NeverReady:
        @staticmethod
        def wait(refs, num_returns=1, timeout=None):
            return [], list(refs)

    assert _wait(NeverReady, {0: "a", 1: "b"}, 0.3) is None
    results = _collect(NeverReady, {0: "a", 1: "b"}, [None, None], tmp_path, 2, None)
    assert [r.error for r in results] == ["timed out after rollout.worker_timeout"] * 2
