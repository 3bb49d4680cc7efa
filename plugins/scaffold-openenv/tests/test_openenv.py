"""A local OpenEnv environment (tests/guess_env.py, written against openenv-core's API) played by the openenv
controller: rewards equal the environment's own for the same actions, observations are environment tokens,
one instance per episode; bad classes and fields are one-line config errors."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("openenv.core.env_server.interfaces")

import guess_env  # noqa: E402
import scaffold_openenv  # noqa: E402
from scaffold_testkit import plugin_set  # noqa: E402

import scaffold_multiturn  # noqa: E402
from scaffold_core.config import load_config  # noqa: E402
from scaffold_core.errors import ConfigError  # noqa: E402
from scaffold_core.output import read_records
from scaffold_core.run.rollout import Rollout  # noqa: E402

ENV = "guess_env:GuessEnvironment"


def guesser(prompt: str, request: Any) -> str:
    """Bisects on the game's feedback: 5 first, then the middle of what is left."""
    low, high = 1, 9
    guesses = [int(g) for g in re.findall(r"I guess (\d+)", prompt)]
    for guess, hint in zip(guesses, re.findall(r"No, (higher|lower)", prompt)):
        low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
    return f"I guess {(low + high) // 2}"


def run(tmp_path, script, **controller) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from scaffold_testkit import ScriptedEngine

    from scaffold_core import hookimpl

    class Engines:
        @hookimpl
        def register_engines(self, registry):
            registry.add("scripted", lambda: ScriptedEngine(script))

    import scaffold_testkit.plugin as test_tasks

    pset = plugin_set(test_tasks, scaffold_multiturn, scaffold_openenv, Engines())
    rows = [{"id": f"g{i}", "question": "Let's play.", "answer": ""} for i in range(4)]
    config = load_config(data={"task": {"name": "list", "rows": rows},
                               "controller": {"name": "openenv", "environment": ENV, **controller},
                               "engine": {"name": "scripted"}, "sampling": {"max_tokens": 32, "seed": 7},
                               "trajectory": {"name": "multiturn"}}, registry=pset.registry)
    metrics = Rollout(config, output_dir=tmp_path, plugins=pset, progress=False).run()
    return metrics, list(read_records(tmp_path))


def replay(seed: int, actions: list[str]) -> list[float]:
    """The environment driven directly with the same seed and actions."""
    env = guess_env.GuessEnvironment()
    env.reset(seed=seed)
    rewards = []
    for text in actions:
        observation = env.step(guess_env.GuessAction(message=text))
        rewards.append(observation.reward)
        if observation.done:
            break
    return rewards


def test_rewards_are_the_environments_own_and_observations_are_environment_tokens(tmp_path):
    metrics, episodes = run(tmp_path, guesser, max_turns=3)
    assert metrics["completed"] == 4 and metrics["failed"] == 0
    for episode in episodes:
        sample = episode["samples"][0]
        actions = [m["content"] for m in sample["metadata"]["messages"] if m["role"] == "assistant"]
        seed = sample["metadata"]["reset_seed"]
        assert sample["metadata"]["step_rewards"] == replay(seed, actions)
        assert sample["reward"] == sum(replay(seed, actions))
        feedback = [m["content"] for m in sample["metadata"]["messages"] if m["role"] == "user"]
        assert feedback[0] == "Guess my number from 1 to 9."  # reset's observation, after the task's prompt
        assert all(f.startswith("No, ") for f in feedback[1:])  # each wrong guess was told, as environment tokens
    assert any(len(e["samples"][0]["metadata"]["messages"]) > 1 for e in episodes)  # some games took turns


def test_env_args_reach_the_environment_and_bad_classes_or_fields_are_config_errors(tmp_path):
    metrics, episodes = run(tmp_path, lambda p, r: "I guess 5", max_turns=1, env_args={"low": 5, "high": 5})
    assert metrics["reward_mean"] == 1.0
    with pytest.raises(ConfigError, match="is not an OpenEnv Environment class"):
        run(tmp_path / "x", guesser, environment="json:JSONDecoder")
    with pytest.raises(ConfigError, match="GuessAction has no field 'text'"):
        run(tmp_path / "y", guesser, action_field="text")
