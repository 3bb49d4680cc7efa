"""examples/multiturn-gsm8k.yaml: it resolves, runs under `scaffold run` (Rollout) end to end, and stays small."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from scaffold_core.config import load_config
from scaffold_core.engines.canned import CannedBenchmarkEngine
from scaffold_core.output import read_records
from scaffold_core.plugins import get_plugins
from scaffold_core.run.rollout import Rollout

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "multiturn-gsm8k.yaml"


@pytest.fixture(scope="module")
def plugins():
    plugins = get_plugins()  # the installed plugins, as `scaffold run` sees them
    if "multiturn_gsm8k" not in plugins.registry.names("task"):
        pytest.skip("scaffold-multiturn is not installed in this environment")
    return plugins


def test_example_is_small_offline_multiturn_and_embedded(plugins):
    config = load_config(EXAMPLE, registry=plugins.registry)
    assert (config.task.name, config.controller.name, config.trajectory.name) == (
        "multiturn_gsm8k", "multiturn_chat", "multiturn")
    assert config.engine.name == "transformers" and config.verifier.name == "gsm8k"
    assert config.task.options["source"] == "sample" and config.task.options["limit"] <= 8
    assert config.sampling.max_tokens <= 256
    environment = config.controller.options["environment"]
    assert environment["name"] == "verifier_feedback" and "{answer} is not correct" in environment["wrong_message"]


def ledger(out: Path) -> list[dict]:
    return list(read_records(out))  # token arrays as lists, from the run's store


def test_example_shape_on_the_canned_engine(plugins, tmp_path):
    import datasets

    canned = json.dumps("Half of 8 is 4.\n#### 4")
    config = load_config(EXAMPLE, ["engine.name=benchmark_canned", f"engine.response={canned}",
                                   "task.limit=3", "rollout.progress=false"], registry=plugins.registry)
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    assert (metrics["completed"], metrics["samples"], metrics["turns"]) == (3, 3, 3.0)
    assert metrics["drift"] == 0.0 and metrics["reward_mean"] == 0.0
    for episode in ledger(tmp_path / "run"):
        sample = episode["samples"][0]
        assert sample["turn_rewards"] == [0.0, 0.0, 0.0]
        replies = [m["content"] for m in sample["metadata"]["messages"] if m["role"] == "user"]
        assert replies and all(r.startswith("Your final answer 4 is not correct.") for r in replies)
    trajectories = datasets.load_from_disk(str(tmp_path / "run" / "trajectories"))
    assert len(trajectories) == 3
    row = trajectories[0]
    assert len(row["turn_starts"]) == len(row["turn_ends"]) == len(row["turn_rewards"]) == 3
    trained = sum(row["loss_mask"])
    assert trained == sum(e - s for s, e in zip(row["turn_starts"], row["turn_ends"]))


class TurnVersionsEngine(CannedBenchmarkEngine):
    """The canned engine as if a trainer moved the weights from 3 to 4 two tokens into the second turn: the
    first call runs on weights 3 (its weight_version says so), the second reports its versions token by token."""

    async def generate(self, request):
        result = await super().generate(request)
        result.weight_version = 3
        if self.requests > 1:
            result.versions = [3, 3] + [4] * (len(result.output_ids) - 2)
        return result


def test_a_conversation_on_weights_3_then_4_is_saved_with_3s_and_4s_per_token(plugins, tmp_path):
    import datasets
    from scaffold_testkit import plugin_set

    import scaffold_gsm8k
    import scaffold_multiturn
    from scaffold_core import hookimpl

    versioned = types.ModuleType("versioned_engine")
    versioned.register_engines = hookimpl(lambda registry: registry.add("turn_versions", TurnVersionsEngine))
    mine = plugin_set(multiturn=scaffold_multiturn, gsm8k=scaffold_gsm8k, versioned=versioned)
    config = load_config(EXAMPLE, ["engine.name=turn_versions", "task.limit=1", "controller.max_turns=2",
                                   "rollout.progress=false"], registry=mine.registry)
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=mine).run()
    assert (metrics["completed"], metrics["turns"]) == (1, 2.0)
    (row,) = datasets.load_from_disk(str(tmp_path / "run" / "trajectories")).to_list()
    (first, second) = zip(row["turn_starts"], row["turn_ends"])
    versions = row["versions"]
    assert versions[:first[0]] == [-1] * first[0]  # the prompt
    assert versions[first[0]:first[1]] == [3] * (first[1] - first[0])
    assert versions[first[1]:second[0]] == [-1] * (second[0] - first[1])  # the environment's reply
    assert versions[second[0]:second[1]] == [3, 3] + [4] * (second[1] - second[0] - 2)
    assert [v for v, m in zip(versions, row["loss_mask"]) if not m] == [-1] * (len(versions) - sum(row["loss_mask"]))


@pytest.mark.model
def test_example_on_the_real_model(plugins, tmp_path):
    """The example cut to 2 problems, 2 turns of 16 tokens, no few-shot turns: SmolLM2 in real conversations."""
    overrides = ["task.limit=2", "task.few_shot=0", "sampling.max_tokens=16", "controller.max_turns=2",
                 "engine.threads=1"]  # one thread: several times faster than more on a busy small machine
    config = load_config(EXAMPLE, [*overrides,
                                   "rollout.progress=false"], registry=plugins.registry)
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    assert (metrics["episodes"], metrics["completed"], metrics["failed"]) == (2, 2, 0)
    assert metrics["drift"] == 0.0
    for episode in ledger(tmp_path / "run"):
        sample = episode["samples"][0]
        assert 1 <= len(sample["metadata"]["turns"]) <= 2
        assert sample["reward"] in (0.0, 0.5, 1.0)
        trajectory = episode["trajectories"][0]
        assert trajectory["input_ids"][:trajectory["prompt_len"]] and sum(trajectory["loss_mask"]) <= 32
