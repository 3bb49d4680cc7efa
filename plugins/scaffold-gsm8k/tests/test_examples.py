"""The example configs in examples/: they resolve, run end to end, and `make run`'s stays small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaffold_core.config import load_config, read_yaml
from scaffold_core.plugins import get_plugins
from scaffold_core.run.rollout import Rollout

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
NAMES = ["gsm8k.yaml", "gsm8k-majority.yaml", "gsm8k-grpo.yaml", "gsm8k-sglang.yaml"]
CANNED = "Half of 8 is 4.\n#### 4"


@pytest.fixture(scope="module")
def plugins():
    plugins = get_plugins()  # the installed plugins, as `scaffold run` sees them
    if "gsm8k" not in plugins.registry.names("task"):
        pytest.skip("scaffold-gsm8k is not installed in this environment")
    return plugins


def _data(name: str) -> dict:
    return read_yaml(EXAMPLES / name)


@pytest.mark.parametrize("name", NAMES)
def test_example_names_the_gsm8k_task_and_resolves(plugins, name):
    raw = _data(name)
    assert raw["task"]["name"] == "gsm8k"
    if raw["engine"]["name"] == "sglang" and "sglang" not in plugins.registry.names("engine"):
        raw["engine"] = {"name": "benchmark_canned"}  # the rest must still be valid without a GPU plugin
    config = load_config(data=raw, registry=plugins.registry)
    assert config.verifier.name == "gsm8k"
    assert config.sampling.max_tokens == raw["sampling"]["max_tokens"]


def test_make_run_example_is_small_offline_and_native(plugins):
    config = load_config(EXAMPLES / "gsm8k.yaml", registry=plugins.registry)
    assert config.task.options["source"] == "sample"
    assert config.task.options["limit"] <= 8
    assert config.sampling.max_tokens <= 256
    assert (config.controller.name, config.engine.name) == ("native", "transformers")


def test_sglang_example_targets_the_sglang_engine():
    raw = _data("gsm8k-sglang.yaml")
    assert raw["engine"]["name"] == "sglang" and raw["sampling"]["max_tokens"] >= 512


def _run_canned(plugins, name: str, tmp_path: Path) -> tuple[dict, Path]:
    config = load_config(EXAMPLES / name, ["engine.name=benchmark_canned", f"engine.response={json.dumps(CANNED)}",
                                           "task.limit=2", "rollout.progress=false"], registry=plugins.registry)
    if config.engine.name != "benchmark_canned":  # pragma: no cover - guards the override above
        pytest.fail("engine override did not apply")
    out = tmp_path / name.removesuffix(".yaml")
    return Rollout(config, output_dir=out, plugins=plugins).run(), out


def test_majority_example_shape_on_the_canned_engine(plugins, tmp_path):
    metrics, out = _run_canned(plugins, "gsm8k-majority.yaml", tmp_path)
    assert (metrics["completed"], metrics["samples"]) == (2, 8)
    assert "maj@4" in metrics


def test_grpo_example_shape_on_the_canned_engine(plugins, tmp_path):
    import datasets

    metrics, out = _run_canned(plugins, "gsm8k-grpo.yaml", tmp_path)
    assert (metrics["completed"], metrics["samples"]) == (2, 8)
    trajectories = datasets.load_from_disk(str(out / "trajectories"))
    assert len(trajectories) == 8 and len(set(trajectories["group_id"])) == 2


@pytest.mark.model
def test_make_run_example_on_the_real_model(plugins, tmp_path):
    """`make run`'s config, cut to 2 problems and 16 tokens: real prompts through SmolLM2, real outputs."""
    config = load_config(EXAMPLES / "gsm8k.yaml", ["task.limit=2", "sampling.max_tokens=16",
                                                   "rollout.progress=false"], registry=plugins.registry)
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    assert (metrics["episodes"], metrics["completed"], metrics["failed"]) == (2, 2, 0)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2
    for sample in samples:
        assert sample["prompt"].startswith("<|im_start|>system\nYou are a careful math tutor")
        assert "####" in sample["prompt"] and sample["response"]
        assert sample["reward"] in (0.0, 1.0) and sample["reason"]
        assert 1 <= sample["generated_tokens"] <= 16
    assert (tmp_path / "run" / "metrics.json").is_file() and (tmp_path / "run" / "trajectories").is_dir()
