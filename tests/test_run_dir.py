"""A run directory holds one run: locked while it runs, resumed only with the config it was made with,
never written through a link, private by default; damaged files are rebuilt from the ledger or give a
one-line error, never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scaffold_core import cli
from scaffold_core.errors import RunDirError
from scaffold_core.output import read_records
from scaffold_core.output.files import atomic_writer, open_append
from scaffold_core.output.lock import LOCK_FILE, RunLock
from scaffold_core.plugins import set_plugins

COUNT = 6



def write_config(path: Path, count: int = COUNT, **rollout) -> Path:
    path.write_text(yaml.safe_dump({
        "task": {"name": "arithmetic", "count": count},
        "engine": {"name": "benchmark_canned", "response": "#### 42"},
        "sampling": {"max_tokens": 16},
        "rollout": {"progress": False, "concurrency": 4, **rollout},
    }))
    return path


def scaffold(*args: str) -> tuple[int, str, str]:
    """``scaffold ARGS`` in this process: (exit code, stdout, stderr). An exception escaping is a bug."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return int(code), out.getvalue(), err.getvalue()


def error_line(stderr: str) -> str:
    """The error of a failed command: exactly one line starting with ``error:``, and no traceback."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


def ok_records(directory: Path) -> Counter[str]:
    """How many completed records each episode has in the run's stores."""
    counts: Counter[str] = Counter()
    for record in read_records(directory, ordered=False):
        if record["status"] == "ok":
            counts[record["episode_id"]] += 1
    return counts


def stored_count(directory: Path) -> int:
    """The episodes in the run's store (read while a run writes it)."""
    if not (directory / "episodes.db").exists():
        return 0
    with contextlib.closing(sqlite3.connect(directory / "episodes.db")) as db:
        try:
            return db.execute("SELECT count(*) FROM episodes").fetchone()[0]
        except sqlite3.OperationalError:  # no table yet
            return 0


def sample_ids(directory: Path) -> list[str]:
    return sorted(json.loads(line)["episode_id"] for line in (directory / "samples.jsonl").read_text().splitlines())


EXPECTED = sorted(f"arith-{i:05d}" for i in range(COUNT))


# -- resume refuses a changed run -------------------------------------------------------------------


def test_resume_refuses_a_changed_config_naming_the_changed_keys(test_plugins, tmp_path):
    config = write_config(tmp_path / "run.yaml")
    out = tmp_path / "out"
    assert scaffold("run", str(config), "-o", str(out))[0] == 0
    saved = (out / "config.yaml").read_bytes()
    ledger = (out / "episodes.db").read_bytes()

    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume",
                            "--set", "sampling.temperature=0.5", "--set", "task.count=8")
    assert code == 1
    line = error_line(err)
    assert "sampling.temperature: 1.0 -> 0.5" in line and "task.count: 6 -> 8" in line
    assert "--force-config" in line and f"scaffold run {out / 'config.yaml'} -o {out} --resume" in line
    assert (out / "config.yaml").read_bytes() == saved and (out / "episodes.db").read_bytes() == ledger

    # How the run executes may change: workers, timeouts, concurrency, progress, output-only options.
    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume", "--no-progress",
                            "--set", "rollout.concurrency=2", "--set", "rollout.request_timeout=60",
                            "--set", "verifier.timeout=5", "--set", "output.save_dataset=false")
    assert code == 0, err

    # --force-config continues, loudly, and records what changed.
    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume", "--force-config",
                            "--set", "sampling.temperature=0.5")
    assert code == 0, err
    assert "WARNING: --force-config" in err and "sampling.temperature: 1.0 -> 0.5" in err
    history = [json.loads(line) for line in (out / "config-history.jsonl").read_text().splitlines()]
    assert history[-1]["changed"] == {"sampling.temperature": {"saved": 1.0, "now": 0.5}}
    assert yaml.safe_load((out / "config.yaml").read_text())["sampling"]["temperature"] == 0.5


# -- one run per output directory ------------------------------------------------------------------


def test_a_second_run_on_a_directory_in_use_is_refused_naming_pid_and_host(test_plugins, tmp_path):
    config = write_config(tmp_path / "run.yaml", count=40)
    data = yaml.safe_load(config.read_text())
    data["engine"]["delay_s"] = 0.1
    data["rollout"]["concurrency"] = 2
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "scaffold_core.cli", "run", str(config), "-o", str(out),
                              "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while stored_count(out) < 2:
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        for extra in (["--resume"], []):  # a resume while it runs, or a second run on the same directory
            code, _, err = scaffold("run", str(config), "-o", str(out), *extra)
            assert code == 1
            line = error_line(err)
            assert f"in use by another scaffold run (pid {first.pid} on host {socket.gethostname()}" in line
        os.killpg(first.pid, signal.SIGKILL)  # the holder dies: its lock goes with it
        first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume")
    assert code == 0, err
    assert ok_records(out) == Counter({f"arith-{i:05d}": 1 for i in range(40)})


def test_the_lock_is_released_on_every_exit_and_names_its_holder(tmp_path):
    with RunLock(tmp_path) as lock:
        with pytest.raises(RunDirError, match=f"pid {os.getpid()} on host"):
            RunLock(tmp_path).acquire()
        assert lock.held
    RunLock(tmp_path).acquire().release()  # released: taken again at once
    (tmp_path / LOCK_FILE).write_bytes(b"\xff garbage left by a dead holder")
    RunLock(tmp_path).acquire().release()  # a lock file nobody holds is never stale


# -- writes that cannot escape the output directory ------------------------------------------------

#: Every name a run writes (files, folders, temp names of earlier versions), and how the run fails.
LINKED_NAMES = ["episodes.db", "episodes.db-wal", "episodes.db-shm", "samples.jsonl", "failures.jsonl",
                "metrics.json", "config.yaml", "trajectories", "trajectories.parquet", "config-history.jsonl",
                LOCK_FILE, "episodes.rank-00000.db", "workers", "workers/rank-00000.log", "workers/rank-00000.json",
                ".samples.jsonl.tmp", ".failures.jsonl.tmp", ".trajectories.tmp", ".metrics.json.tmp"]
#: Names above that are folders.
LINKED_FOLDERS = ("trajectories", "workers", ".trajectories.tmp")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("name", LINKED_NAMES)
@pytest.mark.parametrize("state", ["fresh", "resumed"])
def test_no_file_is_written_through_a_link(test_plugins, tmp_path, name, state):
    config = write_config(tmp_path / "run.yaml")
    out = tmp_path / "out"
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "file").write_text("precious\n")
    (outside / "dir" / "kept").write_text("precious\n")
    if state == "resumed":
        assert scaffold("run", str(config), "-o", str(out))[0] == 0
    link = out / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    else:
        link.unlink(missing_ok=True)
    link.symlink_to(outside / ("dir" if name in LINKED_FOLDERS else "file"))
    before = snapshot(outside)
    code, _, err = scaffold("run", str(config), "-o", str(out), *(["--resume"] if state == "resumed" else []))
    assert snapshot(outside) == before, "a run wrote outside its output directory"
    if name.endswith(".tmp"):  # a stale temp name: never used again, the link itself is removed
        assert code == 0, err
        assert not link.is_symlink() and sample_ids(out) == EXPECTED
    else:
        assert code == 1
        line = error_line(err)
        assert f"{link} is a symbolic link" in line and "Remove the link" in line


def test_appends_and_replacements_never_follow_a_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("precious\n")
    link = tmp_path / "episodes.jsonl"
    link.symlink_to(target)
    with pytest.raises(RunDirError, match="is a symbolic link"):
        open_append(link)
    with atomic_writer(link) as fh:  # a whole-file write replaces the link itself
        fh.write("new\n")
    assert target.read_text() == "precious\n" and not link.is_symlink() and link.read_text() == "new\n"


# -- private files ---------------------------------------------------------------------------------


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]
            if p.name != LOCK_FILE}


def test_files_a_run_writes_are_private_unless_configured(test_plugins, tmp_path):
    config = write_config(tmp_path / "run.yaml")
    old = os.umask(0o022)
    try:
        assert scaffold("run", str(config), "-o", str(tmp_path / "private"))[0] == 0
        assert scaffold("run", str(config), "-o", str(tmp_path / "shared"), "--set", "output.private=false")[0] == 0
    finally:
        os.umask(old)
    private = modes(tmp_path / "private")
    assert {"episodes.db", "samples.jsonl", "failures.jsonl", "metrics.json", "config.yaml",
            "trajectories", "trajectories/state.json"} <= set(private)
    for name, mode in private.items():
        is_dir = (tmp_path / "private" / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), (name, oct(mode))
    for name, mode in modes(tmp_path / "shared").items():
        is_dir = (tmp_path / "shared" / name).is_dir()
        assert mode == (0o755 if is_dir else 0o644), (name, oct(mode))


# -- damaged files on resume -----------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["binary", "truncated", "not a mapping", "empty"])
def test_a_damaged_saved_config_is_a_one_line_error_naming_it(test_plugins, tmp_path, damage):
    config = write_config(tmp_path / "run.yaml")
    out = tmp_path / "out"
    assert scaffold("run", str(config), "-o", str(out))[0] == 0
    saved = out / "config.yaml"
    text = saved.read_bytes()
    saved.write_bytes({"binary": b"\x00\xff\xfe garbage", "truncated": text[: len(text) // 3] + b"\n  - [",
                       "not a mapping": b"- 1\n- 2\n", "empty": b""}[damage])
    damaged = saved.read_bytes()
    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume")
    assert code == 1
    line = error_line(err)
    assert str(saved) in line and "--force-config" in line
    assert saved.read_bytes() == damaged  # nothing already written is lost
    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume", "--force-config")
    assert code == 0, err
    assert sample_ids(out) == EXPECTED


@pytest.mark.parametrize("lost", [1, 3])
def test_episodes_a_kill_lost_are_redone_on_resume_and_the_outputs_equal_a_clean_runs(test_plugins, tmp_path, lost):
    """What SIGKILL leaves: the steps written before it (the last episodes are missing) and no exported file.
    No finished episode is lost, none is done twice, the outputs equal a clean run's."""
    config = write_config(tmp_path / "run.yaml")
    clean, out = tmp_path / "clean", tmp_path / "out"
    assert scaffold("run", str(config), "-o", str(clean))[0] == 0
    shutil.copytree(clean, out)
    with contextlib.closing(sqlite3.connect(out / "episodes.db")) as db:
        db.execute("DELETE FROM episodes WHERE seq > (SELECT max(seq) FROM episodes) - ?", (lost,))
        db.commit()
    (out / "samples.jsonl").unlink()
    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume")
    assert code == 0, err
    assert ok_records(out) == Counter(EXPECTED), "an episode was lost or done twice"
    assert (out / "samples.jsonl").read_bytes() == (clean / "samples.jsonl").read_bytes()
    import datasets

    assert datasets.load_from_disk(str(out / "trajectories")).to_list() == \
        datasets.load_from_disk(str(clean / "trajectories")).to_list()
    assert json.loads((out / "metrics.json").read_text())["session"]["episodes"] == lost


def test_a_kill_during_the_final_write_is_rebuilt_from_the_store_on_resume(test_plugins, tmp_path):
    """What SIGKILL during the last writes of a resumed run leaves: old or half-written metrics, samples and
    failures, a half-saved dataset under a temp name, the old dataset gone. Resume trusts none of it."""
    config = write_config(tmp_path / "run.yaml")
    clean, out = tmp_path / "clean", tmp_path / "out"
    assert scaffold("run", str(config), "-o", str(clean))[0] == 0
    shutil.copytree(clean, out)
    (out / "metrics.json").write_text('{"episodes": 3, "completed": 3, "failed": 0')  # cut mid-write
    samples = (out / "samples.jsonl").read_bytes()
    (out / "samples.jsonl").write_bytes(samples[: len(samples) // 2])
    (out / ".metrics.json.k1ll3d").write_text('{"episodes": 2')
    (out / ".samples.jsonl.k1ll3d").write_bytes(samples[:10])
    shutil.copytree(out / "trajectories", out / ".trajectories.k1ll3d")
    (out / ".trajectories.k1ll3d" / "state.json").write_text("{")
    shutil.rmtree(out / "trajectories")
    code, stdout, err = scaffold("run", str(config), "-o", str(out), "--resume", "--json")
    assert code == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    reference = json.loads((clean / "metrics.json").read_text())
    for key in ("episodes", "completed", "failed", "samples", "reward_mean", "accuracy", "generated_tokens"):
        assert metrics[key] == reference[key], key
    assert json.loads(stdout)["completed"] == COUNT  # the printed summary too
    assert (out / "samples.jsonl").read_bytes() == (clean / "samples.jsonl").read_bytes()
    import datasets

    assert datasets.load_from_disk(str(out / "trajectories")).to_list() == \
        datasets.load_from_disk(str(clean / "trajectories")).to_list()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".") and p.name != LOCK_FILE]


# -- a failed start leaves no trap ------------------------------------------------------------------


def test_a_start_that_fails_on_its_data_leaves_nothing_that_refuses_the_corrected_run(test_plugins, tmp_path):
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n"
                    + json.dumps({"question": "How many?", "answer": "many"}) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(f"task: {{name: gsm8k, data_files: {data}}}\n"
                      "engine: {name: benchmark_canned, response: '#### 2'}\nrollout: {bad_rows: fail}\n")
    out = tmp_path / "out"
    code, _, err = scaffold("run", str(config), "-o", str(out))
    assert code == 1 and "1 dataset rows are unusable" in error_line(err)
    assert not (out / "config.yaml").exists()
    # The corrected run, as a fresh run or as a resume with the corrected config, is not refused.
    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume", "--set", "rollout.bad_rows=skip",
                            "--set", "sampling.max_tokens=8")
    assert code == 0, err
    # A directory a multi-worker launcher left when every worker failed at its data: no episode in it.
    left = tmp_path / "left"
    left.mkdir()
    (left / "config.yaml").write_text("task: {name: gsm8k}\n")
    for name in ("episodes.rank-00000.db", "samples.jsonl", "failures.jsonl"):
        (left / name).write_text("")
    (left / "workers").mkdir()
    (left / "workers" / "rank-00000.log").write_text("error: 1 dataset rows are unusable\n")
    code, _, err = scaffold("run", str(config), "-o", str(left), "--set", "rollout.bad_rows=skip")
    assert code == 0, err
    assert (left / "workers" / "rank-00000.log").read_text().startswith("error: 1 dataset rows")  # logs kept


# -- property: any damage to a run directory, then --resume ------------------------------------------

#: Files of a finished run (a killed one: only some of them) that the fuzz test damages.
DAMAGEABLE = ["episodes.db", "config.yaml", "metrics.json", "samples.jsonl",
              "failures.jsonl", "trajectories", "trajectories/state.json", "trajectories/dataset_info.json",
              "trajectories/data-00000-of-00001.arrow", LOCK_FILE]
damage = st.tuples(st.sampled_from(DAMAGEABLE),
                   st.sampled_from(["truncate", "garbage", "append", "link", "delete"]),
                   st.integers(0, 1 << 16), st.binary(min_size=1, max_size=64))


def apply_damage(root: Path, outside: Path, name: str, kind: str, number: int, junk: bytes) -> None:
    path = root / name
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        if kind in ("link", "delete", "garbage"):
            shutil.rmtree(path)
            if kind == "link":
                path.symlink_to(outside / "dir")
            elif kind == "garbage":
                path.write_bytes(junk)
        return
    if kind == "truncate" and path.is_file() and not path.is_symlink():
        data = path.read_bytes()
        path.write_bytes(data[: number % (len(data) + 1)])
    elif kind == "garbage":
        path.unlink()
        path.write_bytes(junk)
    elif kind == "append" and not path.is_symlink():
        with path.open("ab") as fh:
            fh.write(junk + (b"\n" if number % 2 else b""))
    elif kind == "link":
        path.unlink()
        path.symlink_to(outside / "file")
    elif kind == "delete":
        path.unlink()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A clean finished run (its directory and config), made once for the fuzz test."""
    root = tmp_path_factory.mktemp("fuzz")
    config = write_config(root / "run.yaml")
    old = os.environ.get("SCAFFOLD_EXTRA_PLUGINS")
    os.environ["SCAFFOLD_EXTRA_PLUGINS"] = "scaffold_testkit.plugin"
    previous = set_plugins(None)
    try:
        assert scaffold("run", str(config), "-o", str(root / "clean"))[0] == 0
    finally:
        set_plugins(previous)
        if old is None:
            os.environ.pop("SCAFFOLD_EXTRA_PLUGINS")
        else:
            os.environ["SCAFFOLD_EXTRA_PLUGINS"] = old
    return root, config


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 1 << 16), damages=st.lists(damage, min_size=1, max_size=3))
def test_any_damage_then_resume_completes_like_a_clean_run_or_is_a_one_line_error(test_plugins, finished_run, cut,
                                                                                  damages):
    root, config = finished_run
    import tempfile

    work = Path(tempfile.mkdtemp(dir=root))
    try:
        out, outside = work / "out", work / "outside"
        shutil.copytree(root / "clean", out)
        (outside / "dir").mkdir(parents=True)
        (outside / "file").write_text("precious\n")
        with contextlib.closing(sqlite3.connect(out / "episodes.db")) as db:  # killed after some episodes
            db.execute("DELETE FROM episodes WHERE seq > ?", (cut % (COUNT + 1),))
            db.commit()
        for name, kind, number, junk in damages:
            apply_damage(out, outside, name, kind, number, junk)
        before = snapshot(outside)
        code, _, err = scaffold("run", str(config), "-o", str(out), "--resume", "--no-progress")
        assert snapshot(outside) == before, "a run wrote outside its output directory"
        event(f"exit code {code}")
        if code == 0:
            assert ok_records(out) == Counter(EXPECTED), "an episode was lost or done twice"
            assert sample_ids(out) == EXPECTED
            assert json.loads((out / "metrics.json").read_text())["completed"] == COUNT
        else:
            assert code == 1
            assert str(out) in error_line(err)
    finally:
        shutil.rmtree(work)


# -- records: one transaction per step of the event loop, and a write that fails ---------------------------


def test_episodes_finishing_together_are_written_together(test_plugins, tmp_path, monkeypatch):
    """A run records the episodes that finish in one step of its event loop in one transaction: fewer
    transactions than episodes, and every episode once."""
    from scaffold_core.output.store import EpisodeStore

    batches: list[int] = []
    real = EpisodeStore._write

    def spy(self, rows, *rest):
        batches.append(len(rows))
        real(self, rows, *rest)

    monkeypatch.setattr(EpisodeStore, "_write", spy)
    config = write_config(tmp_path / "run.yaml", count=40, concurrency=8)
    assert scaffold("run", str(config), "-o", str(tmp_path / "out"))[0] == 0
    assert ok_records(tmp_path / "out") == Counter(f"arith-{i:05d}" for i in range(40))
    assert sum(batches) == 40 and len(batches) < 40


def test_a_store_write_that_fails_stops_the_run_with_one_error_and_resume_completes_it(test_plugins, tmp_path,
                                                                                      monkeypatch):
    """A full disk under the store: the run stops with a one-line error naming the store, the cause and the
    fix; what was written reads back, and --resume then runs every episode exactly once."""
    from scaffold_core.output.store import EpisodeStore

    real = EpisodeStore._write
    calls = [0]

    def full_disk(self, rows, *rest):
        calls[0] += 1
        if calls[0] == 3:
            raise sqlite3.OperationalError("database or disk is full")
        real(self, rows, *rest)

    monkeypatch.setattr(EpisodeStore, "_write", full_disk)
    config = write_config(tmp_path / "run.yaml", count=40, concurrency=8)
    out = tmp_path / "out"
    code, _, err = scaffold("run", str(config), "-o", str(out))
    assert code != 0
    line = error_line(err)
    assert str(out / "episodes.db") in line and "database or disk is full" in line and "--resume" in line
    before = ok_records(out)
    assert 0 < sum(before.values()) < 40 and set(before.values()) == {1}
    monkeypatch.setattr(EpisodeStore, "_write", real)
    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume")
    assert code == 0, err
    assert ok_records(out) == Counter(f"arith-{i:05d}" for i in range(40))
    assert len(sample_ids(out)) == 40


def test_after_a_failed_write_nothing_more_is_recorded(tmp_path, monkeypatch):
    from scaffold_core.episode import EpisodeResult
    from scaffold_core.output import rundir
    from scaffold_core.output.store import EpisodeStore

    out = rundir.RunOutput(tmp_path / "out")
    try:
        out.deferred = True
        out.append(EpisodeResult("e0", 0, "failed", error="engine raised", error_component="engine"))
        assert stored_count(tmp_path / "out") == 0  # held until the flush

        def broken(self, rows, *rest):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(EpisodeStore, "_write", broken)
        with pytest.raises(OSError):
            out.flush()
        with pytest.raises(RunDirError, match="an earlier write failed .*Input/output error.*--resume"):
            out.append(EpisodeResult("e1", 1, "failed", error="engine raised", error_component="engine"))
        out.close()
    finally:
        out.release()
    assert stored_count(tmp_path / "out") == 0


def test_resuming_a_run_of_a_version_before_the_store_is_a_one_line_error(test_plugins, tmp_path):
    config = write_config(tmp_path / "run.yaml")
    out = tmp_path / "out"
    out.mkdir()
    (out / "episodes.jsonl").write_text('{"episode_id": "arith-00000", "status": "ok"}\n')
    code, _, err = scaffold("run", str(config), "-o", str(out), "--resume")
    assert code == 1
    line = error_line(err)
    assert str(out) in line and "earlier scaffold version" in line and "-o" in line
    assert (out / "episodes.jsonl").read_text().startswith('{"episode_id"')  # left as it was
