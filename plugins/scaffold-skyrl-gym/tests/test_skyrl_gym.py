"""skyrl-gym environments through the skyrl_gym task and the gym_env controller: an environment written here
against skyrl-gym's public API, and every registered environment that needs no outside service; for the same
completions, scaffold's rewards equal the ones the environment gives when driven directly."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import scaffold_skyrl_gym
from scaffold_testkit import ScriptedEngine, make_contexts, plugin_set, run_episodes
from scaffold_testkit.conformance import ControllerConformance, TaskConformance
from scaffold_testkit.conformance.controllers import right_or_wrong

import scaffold_multiturn
from scaffold_core.errors import ConfigError, DataError
from scaffold_core.sampling import SamplingParams

skyrl_gym = pytest.importorskip("skyrl_gym")
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


class GuessEnv(BaseTextEnv):
    """Guess the number: each wrong guess gets a hint (an observation) and a small penalty; a right one ends it."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        extras = extras or {}
        self.target = int(extras["reward_spec"]["ground_truth"])
        self.max_turns = int(extras.get("max_turns", 4))
        self.penalty = float((env_config or {}).get("penalty", 0.1))

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        found = re.findall(r"-?\d+", action)
        guess = int(found[-1]) if found else None
        if guess == self.target:
            return BaseTextEnvStepOutput(observations=[], reward=1.0, done=True, metadata={"guess": guess})
        done = self.turns >= self.max_turns
        hint = "no number" if guess is None else ("higher" if guess < self.target else "lower")
        return BaseTextEnvStepOutput(observations=[] if done else [{"role": "user", "content": f"Wrong: {hint}."}],
                                     reward=-self.penalty, done=done, metadata={"guess": guess})

    def get_metrics(self) -> dict[str, Any]:
        return {"guesses": self.turns}


if "scaffold_test_guess" not in skyrl_gym.registry:
    skyrl_gym.register(id="scaffold_test_guess", entry_point=GuessEnv)


def registry() -> Any:
    plugins = plugin_set(skyrl_gym=scaffold_skyrl_gym, multiturn=scaffold_multiturn)
    assert not plugins.registry.broken, plugins.registry.broken
    return plugins.registry


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def turn_of(prompt: str) -> int:
    return prompt.count("<|assistant|>") - 1


def play(tmp_path: Path, rows: list[dict[str, Any]], script: Any, *, task: dict[str, Any] | None = None,
         controller: dict[str, Any] | None = None) -> list[Any]:
    """Every row through the skyrl_gym task and the gym_env controller on a scripted engine."""
    from scaffold_multiturn.trajectory import MultiTurnTrajectoryMaker

    reg = registry()
    data = write_rows(tmp_path / "rows.jsonl", rows)
    the_task = reg.create("task", "skyrl_gym", {"data_files": str(data), **(task or {})}, path="task")
    ctrl = reg.create("controller", "gym_env", dict(controller or {}), path="controller")
    engine = ScriptedEngine(script)
    contexts = make_contexts(the_task, engine.tokenizer, SamplingParams(max_tokens=400, temperature=1.0, seed=5))
    return run_episodes(contexts, engine=engine, controller=ctrl, trajectory_maker=MultiTurnTrajectoryMaker(),
                        timeout=180)


def library_rewards(env_id: str, row: dict[str, Any], actions: list[str], *, env_config: dict[str, Any] | None = None,
                    max_turns: int = 5) -> list[float]:
    """The environment driven directly, as SkyRL's generator drives it: init, then step each action until done."""
    from omegaconf import OmegaConf

    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    env = skyrl_gym.make(env_id, env_config=OmegaConf.create(env_config or {}), extras={**extras,
                                                                                       "max_turns": max_turns})
    env.init(row["prompt"])
    rewards = []
    for action in actions:
        out = env.step(action)
        rewards.append(float(out["reward"]))
        if out["done"]:
            break
    env.close()
    return rewards


# -- an environment written against skyrl-gym's API -------------------------------------------------------


def test_observations_are_environment_tokens_and_step_rewards_are_kept(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "Guess my number (1-10)."}], "env_class": "scaffold_test_guess",
             "reward_spec": {"method": "rule", "ground_truth": "7"}}]
    guesses = ["5", "9", "7"]

    def script(prompt: str, request: Any) -> str:
        return f"My guess: {guesses[turn_of(prompt)]}"

    [result] = play(tmp_path, rows, script, task={"env_args": {"penalty": 0.25}})
    assert result.ok, result.error
    sample, traj = result.samples[0], result.trajectories[0]
    expected = library_rewards("scaffold_test_guess", rows[0], [f"My guess: {g}" for g in guesses],
                               env_config={"penalty": 0.25})
    assert sample.turn_rewards == expected == [-0.25, -0.25, 1.0]
    assert sample.reward == pytest.approx(sum(expected)) and traj.reward == pytest.approx(0.5)
    assert traj.turn_rewards == expected
    assert sample.metadata["end"] == "done" and result.metrics["env_guesses"] == 3.0
    assert [m["content"] for m in sample.metadata["messages"] if m["role"] == "user"] == ["Wrong: higher.",
                                                                                           "Wrong: lower."]
    # Token faithfulness: model turns are the engine's ids (mask 1); observations are mask 0, logprob 0, version -1.
    tok = ScriptedEngine(script).tokenizer
    for start, end in zip(traj.turn_starts, traj.turn_ends):
        assert set(traj.loss_mask[start:end]) == {1}
    observation = tok.encode("Wrong: higher.")
    at = next(i for i in range(len(traj.input_ids)) if traj.input_ids[i:i + len(observation)] == observation)
    assert traj.loss_mask[at:at + len(observation)] == [0] * len(observation)
    assert traj.versions[at:at + len(observation)] == [-1] * len(observation)
    assert traj.logprobs[at:at + len(observation)] == [0.0] * len(observation)
    assert result.metrics["drift"] == 0.0


def test_reward_last_and_max_turns(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "Guess."}], "env_class": "scaffold_test_guess",
             "reward_spec": {"ground_truth": "3"}}]
    [result] = play(tmp_path, rows, lambda p, r: "1", controller={"max_turns": 2, "reward": "last"})
    sample = result.samples[0]
    assert sample.turn_rewards == library_rewards("scaffold_test_guess", rows[0], ["1", "1"], max_turns=2)
    assert sample.reward == -0.1 and len(sample.turn_rewards) == 2


# -- the environments skyrl-gym registers -----------------------------------------------------------------


def test_gsm8k_rewards_equal_the_libraries(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "env_class": "gsm8k",
             "reward_spec": {"method": "rule", "ground_truth": str(2 * i)}, "extra_info": {"index": i}}
            for i in range(1, 5)]
    answers = {1: "#### 2", 2: "It is #### 5", 3: "6", 4: "#### 8.0"}

    def script(prompt: str, request: Any) -> str:
        return answers[int(re.findall(r"What is (\d+)", prompt)[-1])]

    results = play(tmp_path, rows, script)
    for row, result in zip(rows, results):
        assert result.ok, result.error
        i = row["extra_info"]["index"]
        assert result.samples[0].turn_rewards == library_rewards("gsm8k", row, [answers[i]])
    assert [r.samples[0].reward for r in results] == [1.0, 0.0, 0.0, 0.0]


def test_gsm8k_multi_turn_rewards_equal_the_libraries(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "Tom has 3 apples and buys 4. How many?"}],
             "env_class": "gsm8k_multi_turn", "reward_spec": {"ground_truth": "7"}, "extra_info": {}}]
    actions = ["Maybe #### 6", "No wait", "#### 7"]

    def script(prompt: str, request: Any) -> str:
        return actions[turn_of(prompt)]

    [result] = play(tmp_path, rows, script, controller={"max_turns": 4})
    sample = result.samples[0]
    expected = library_rewards("gsm8k_multi_turn", rows[0], actions, max_turns=4)
    assert sample.turn_rewards == expected == [0.05, 0.0, 1.0]
    assert sample.reward == pytest.approx(1.05)
    assert "final numeric answer" not in json.dumps(sample.metadata["messages"])  # 4 turns: not the last hint
    assert sample.metadata["messages"][1]["content"].startswith("Please provide your step-by-step reasoning")


def test_aime_rewards_equal_the_libraries(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "Find x."}], "env_class": "aime",
             "reward_model": {"ground_truth": "204"}, "id": "a"},
            {"prompt": [{"role": "user", "content": "Find y."}], "env_class": "aime",
             "reward_model": {"ground_truth": "33"}, "id": "b"}]
    answers = {"Find x.": "Adding up, x = 204.\nAnswer: 204", "Find y.": "Answer: 34"}

    def script(prompt: str, request: Any) -> str:
        return answers[re.findall(r"Find \w\.", prompt)[-1]]

    results = play(tmp_path, rows, script, task={"id": "id"})
    for row, result in zip(rows, results):
        assert result.ok, result.error
        text = answers[row["prompt"][0]["content"]]
        assert result.samples[0].turn_rewards == library_rewards("aime", row, [text])
    assert [r.samples[0].reward for r in results] == [1.0, -1.0]
    # the column its README names (reward_spec) works too, with the same rewards
    spec_rows = [{**{k: v for k, v in r.items() if k != "reward_model"}, "reward_spec": r["reward_model"]}
                 for r in rows]
    (tmp_path / "spec").mkdir()
    again = play(tmp_path / "spec", spec_rows, script, task={"id": "id"})
    assert [r.samples[0].reward for r in again] == [1.0, -1.0]


def test_lcb_runs_only_with_code_execution_host_and_says_so_loudly(tmp_path, capfd):
    tests = json.dumps([{"input": "2 3\n", "output": "5\n", "testtype": "stdin"}])
    rows = [{"prompt": [{"role": "user", "content": "Read a and b, print a + b."}], "env_class": "lcb",
             "reward_spec": {"ground_truth": tests}}]
    code = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    with pytest.raises(DataError, match=r"environment 'lcb' .* runs the model's code inside skyrl-gym's own "
                                        r"process, which scaffold cannot put in its jail; set "
                                        r"task\.code_execution: host"):
        play(tmp_path, rows, lambda p, r: code)
    with pytest.raises(ConfigError, match="allow_code_execution is now code_execution: host"):
        play(tmp_path, rows, lambda p, r: code, task={"allow_code_execution": True})
    [result] = play(tmp_path, rows, lambda p, r: code, task={"code_execution": "host"})
    assert "WARNING: task.code_execution: host. skyrl-gym environment 'lcb'" in capfd.readouterr().err
    assert result.ok, result.error
    assert result.samples[0].turn_rewards == library_rewards("lcb", rows[0], [code]) == [1.0]


def _spider_db(root: Path) -> Path:
    folder = root / "spider" / "database" / "shop"
    folder.mkdir(parents=True)
    with sqlite3.connect(folder / "shop.sqlite") as db:
        db.execute("CREATE TABLE items (name TEXT, price INTEGER)")
        db.executemany("INSERT INTO items VALUES (?, ?)", [("pen", 2), ("book", 12), ("lamp", 30)])
    return root


def test_text2sql_on_a_local_database_rewards_equal_the_libraries(tmp_path):
    db_path = _spider_db(tmp_path / "sql")
    rows = [{"prompt": [{"role": "user", "content": "Names of items over 10?"}], "env_class": "text2sql",
             "db_id": "shop", "data": "spider",
             "reward_spec": {"ground_truth": "SELECT name FROM items WHERE price > 10"}}]
    actions = ["<think>look</think><sql>SELECT * FROM items</sql>",
               "<think>filter</think><solution>SELECT name FROM items WHERE price >= 11</solution>"]

    def script(prompt: str, request: Any) -> str:
        return actions[turn_of(prompt)]

    [result] = play(tmp_path, rows, script, task={"env_args": {"db_path": str(db_path)}})
    assert result.ok, result.error
    sample = result.samples[0]
    expected = library_rewards("text2sql", rows[0], actions, env_config={"db_path": str(db_path)})
    assert sample.turn_rewards == expected == [0.0, 1.0]
    assert "lamp" in sample.metadata["messages"][1]["content"]  # the tool's observation came back


# -- contracts and errors ---------------------------------------------------------------------------------


class TestGymEnvConformance(ControllerConformance):
    """gym_env over the conformance kit's arithmetic rows, scored by skyrl-gym's gsm8k environment."""

    plugin = scaffold_skyrl_gym
    name = "gym_env"
    options = {"env": "gsm8k", "max_turns": 2}

    def scaffold_registry(self) -> Any:
        return registry()

    def respond(self, prompt: str, request: Any) -> str:
        return f"#### {right_or_wrong(prompt, request)}"


class TestSkyRLGymTaskConformance(TaskConformance):
    plugin = scaffold_skyrl_gym
    name = "skyrl_gym"
    verifier_name = "exact_match"

    @pytest.fixture(autouse=True)
    def _file(self, tmp_path):
        rows = [{"prompt": [{"role": "user", "content": f"{i} + {i}?"}], "env_class": "gsm8k",
                 "reward_spec": {"ground_truth": str(2 * i)}} for i in range(1, 6)]
        type(self).options = {"data_files": str(write_rows(tmp_path / "rows.jsonl", rows))}

    def scaffold_registry(self) -> Any:
        return registry()


def test_task_errors_are_one_line(tmp_path):
    reg = registry()
    no_env = write_rows(tmp_path / "a.jsonl", [{"prompt": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataError, match=r"names no environment \(env_class\) and task\.env is not set"):
        reg.create("task", "skyrl_gym", {"data_files": str(no_env)}, path="task").load()
    no_prompt = write_rows(tmp_path / "b.jsonl", [{"question": "hi", "env_class": "gsm8k"}])
    with pytest.raises(DataError, match=r"task\.messages: column 'prompt' is not in .*b\.jsonl"):
        reg.create("task", "skyrl_gym", {"data_files": str(no_prompt)}, path="task").load()
    with pytest.raises(ConfigError, match="set task.data_files"):
        reg.create("task", "skyrl_gym", {}, path="task")


def test_an_unknown_environment_fails_its_episode_with_the_registered_ids(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "env_class": "no_such_env"}]
    [result] = play(tmp_path, rows, lambda p, r: "x")
    assert not result.ok and result.error_component == "environment"
    assert "skyrl-gym has no environment 'no_such_env'; registered:" in result.error and "gsm8k" in result.error


def test_the_example_config_runs_on_its_bundled_file(tmp_path, monkeypatch):
    from scaffold_core.config import load_config
    from scaffold_core.plugins import get_plugins
    from scaffold_core.run.rollout import Rollout

    monkeypatch.chdir(REPO)
    plugins = get_plugins()
    config = load_config(REPO / "examples" / "skyrl-gym-gsm8k.yaml",
                         ["engine.name=benchmark_canned", "engine.response=#### 42", "rollout.progress=false"],
                         registry=plugins.registry)
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    assert metrics["completed"] == metrics["episodes"] >= 2 and metrics["failed"] == 0
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["reward"] for s in samples)[-1] == 1.0 and min(s["reward"] for s in samples) == 0.0
