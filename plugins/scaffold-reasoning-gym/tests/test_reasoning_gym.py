"""reasoning-gym's datasets as scaffold tasks: any dataset by name, prompts as the library builds them, rewards
equal to each dataset's own score_answer on the same completions (datasets with one answer and with many)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")

import scaffold_reasoning_gym  # noqa: E402
from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer  # noqa: E402
from scaffold_testkit import plugin_set  # noqa: E402

from scaffold_core.config import load_config  # noqa: E402
from scaffold_core.errors import ConfigError, VerifierError  # noqa: E402
from scaffold_core.run.rollout import Rollout  # noqa: E402


@pytest.fixture(scope="module")
def pset():
    return plugin_set(under_test=scaffold_reasoning_gym)


def build(pset, kind: str, **options: Any) -> Any:
    return pset.registry.create(kind, "reasoning_gym", options, path=kind)


#: (dataset, config): one answer per entry, a partial-credit scorer, and a game with many right answers.
DATASETS = [("leg_counting", {"min_animals": 1, "max_animals": 3}), ("basic_arithmetic", {}), ("countdown", {})]


@pytest.mark.parametrize("name, config", DATASETS)
def test_rewards_equal_the_datasets_own_score_answer(pset, name, config):
    task = build(pset, "task", dataset=name, config=config, size=6, seed=3)
    verifier = build(pset, "verifier")
    library = reasoning_gym.create_dataset(name, size=6, seed=3, **config)
    rows = task.load()
    assert len(rows) == 6 and task.messages(rows[0])[0] == {"role": "system", "content": SYSTEM_PROMPTS["default"]}
    for i, row in enumerate(rows):
        entry = library[i]
        assert row["question"] == entry["question"]
        for completion in (f"Thinking... <answer>{entry['answer']}</answer>", "<answer>12</answer>",
                           f"It is {entry['answer']}", f"<answer> {entry['answer']}0 </answer>"):
            verdict = verifier.verify(completion, task.reference(row))
            assert verdict.reward == library.score_answer(extract_answer(completion), entry=entry), completion
        assert verifier.verify(f"<answer>{entry['answer']}</answer>", task.reference(row)).reward == 1.0


def test_a_run_scores_with_the_library(pset, tmp_path):
    config = load_config(data={"task": {"name": "reasoning_gym", "dataset": "leg_counting", "size": 3, "seed": 1},
                               "engine": {"name": "benchmark_canned", "response": "<answer>4</answer>"},
                               "sampling": {"max_tokens": 16}}, registry=pset.registry)
    assert config.verifier.name == "reasoning_gym"  # the task's default
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=pset, progress=False).run()
    library = reasoning_gym.create_dataset("leg_counting", size=3, seed=1)
    expected = [library.score_answer("4", entry=library[i]) for i in range(3)]
    assert metrics["completed"] == 3 and metrics["reward_mean"] == pytest.approx(sum(expected) / 3)


def test_unknown_names_and_bad_configs_are_one_line_errors(pset):
    with pytest.raises(ConfigError, match=r"no dataset 'leg_count'; did you mean leg_counting") as unknown:
        build(pset, "task", dataset="leg_count")
    with pytest.raises(ConfigError, match=r"dataset 'leg_counting' rejected its config") as bad:
        build(pset, "task", dataset="leg_counting", config={"no_such_field": 3})
    assert "\n" not in str(unknown.value) + str(bad.value)
    with pytest.raises(VerifierError, match="scores the reasoning_gym task's rows"):
        build(pset, "verifier").verify("x", "42")


@pytest.mark.model
@pytest.mark.slow
def test_scaffold_train_runs_two_steps_on_a_reasoning_gym_task(tmp_path, tiny_policy):
    pytest.importorskip("scaffold_trl")
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({
        "task": {"name": "reasoning_gym", "dataset": "leg_counting", "size": 4, "seed": 0,
                 "system_prompt": "direct"},
        "engine": {"name": "transformers", "model": str(tiny_policy), "threads": 1, "max_batch_size": 8},
        "sampling": {"max_tokens": 32, "temperature": 1.0},
        "trainer": {"name": "trl", "max_steps": 2, "num_generations": 2, "prompts_per_step": 2,
                    "learning_rate": 1e-5, "seed": 0, "threads": 1, "filter_groups": "none"},
    }), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "train", str(config), "-o", str(tmp_path / "run"),
                          "--no-progress", "--no-report"], env=dict(os.environ), capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["steps"] == 2 and summary["optimizer_steps"] == 2
    steps = [json.loads(line) for line in (tmp_path / "run" / "train_metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(s["loss"]) and 0.0 <= s["reward_mean"] <= 1.0 for s in steps), steps
