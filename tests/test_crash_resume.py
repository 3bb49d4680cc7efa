"""A run killed midway (SIGKILL or SIGINT) loses nothing and resumes without redoing completed episodes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

CONFIG = ("task: {name: hello, limit: 40}\n"
          "engine: {name: benchmark_canned, response: '#### 42', delay_s: 0.15}\n"
          "rollout: {concurrency: 4}\n")


def start_run(site: Path, config: Path, out: Path, *extra: str) -> subprocess.Popen:
    # "dupe" and "clash" are fixtures that clash with other plugins and built-ins
    env = dict(os.environ, PYTHONPATH=str(site), SCAFFOLD_DISABLE_PLUGINS="dupe,clash")
    return subprocess.Popen([sys.executable, "-m", "scaffold_core.cli", "run", str(config), "-o", str(out),
                             "--no-progress", "--json", *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def ledger_ids(out: Path) -> list[str]:
    """The episodes the run's store holds (read while the run writes it, as any SQLite client can)."""
    store = out / "episodes.db"
    if not store.exists():
        return []
    with contextlib.closing(sqlite3.connect(store)) as db:
        try:
            return [eid for (eid,) in db.execute("SELECT episode_id FROM episodes")]
        except sqlite3.OperationalError:  # the run has not made its table yet
            return []


def wait_for_episodes(out: Path, n: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(ledger_ids(out)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "run made no progress"
        time.sleep(0.05)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"run did not finish: {err}") from None
    return proc.returncode, out, err


def test_sigkill_midway_then_resume_equals_a_clean_run(fixture_site, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    clean = tmp_path / "clean"
    code, _, err = finish(start_run(fixture_site, config, clean))
    assert code == 0, err

    killed = tmp_path / "killed"
    proc = start_run(fixture_site, config, killed)
    wait_for_episodes(killed, 8, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    done_before = set(ledger_ids(killed))
    assert 8 <= len(done_before) < 40

    code, _, err = finish(start_run(fixture_site, config, killed, "--resume"))
    assert code == 0, err
    ids = ledger_ids(killed)
    assert len(ids) == len(set(ids)), "an episode was done twice"
    assert set(ids) == set(ledger_ids(clean)) and len(ids) == 40
    clean_samples = {(json.loads(s)["episode_id"], json.loads(s)["response"])
                     for s in (clean / "samples.jsonl").read_text().splitlines()}
    resumed_samples = {(json.loads(s)["episode_id"], json.loads(s)["response"])
                       for s in (killed / "samples.jsonl").read_text().splitlines()}
    assert resumed_samples == clean_samples
    metrics = json.loads((killed / "metrics.json").read_text())
    assert metrics["completed"] == 40 and metrics["resumed_episodes"] == len(done_before)
    assert metrics["session"]["episodes"] == 40 - len(done_before), "a completed episode ran again"


def test_sigint_finishes_in_flight_episodes_flushes_and_exits_nonzero(fixture_site, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "run"
    proc = start_run(fixture_site, config, out)
    wait_for_episodes(out, 4, proc)
    os.killpg(proc.pid, signal.SIGINT)
    code, stdout, err = finish(proc, timeout=60)
    assert code == 130
    assert "SIGINT received" in err and "--resume" in err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["interrupted"] == "SIGINT"
    assert 4 <= metrics["completed"] < 40 and metrics["failed"] == 0  # in-flight episodes finished, not failed
    assert json.loads(stdout)["completed"] == metrics["completed"]  # the summary was printed
    code, _, err = finish(start_run(fixture_site, config, out, "--resume"))
    assert code == 0, err
    ids = ledger_ids(out)
    assert len(ids) == 40 and len(set(ids)) == 40
