"""verifiers environments (written in tests/envs against the verifiers.v1 API) as scaffold tasks: prompts,
rubric rewards equal to the library's own scoring of the same completions, per-function values kept, and a
one-line error for every environment that needs more than one turn."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

vf = pytest.importorskip("verifiers.v1")

import scaffold_verifiers  # noqa: E402
from scaffold_testkit import ScriptedEngine, make_contexts, plugin_set, run_episodes  # noqa: E402
from scaffold_testkit.conformance import TaskConformance, VerifierConformance  # noqa: E402
from scaffold_verifiers.task import VerifiersTask  # noqa: E402

from scaffold_core.config import load_config  # noqa: E402
from scaffold_core.errors import ConfigError  # noqa: E402
from scaffold_core.output import read_records  # noqa: E402
from scaffold_core.plugins import get_plugins  # noqa: E402
from scaffold_core.run.rollout import Rollout  # noqa: E402
from scaffold_core.sampling import SamplingParams  # noqa: E402

ENVS = Path(__file__).resolve().parent / "envs"
BONUS = {"task": {"rewards": {"bonus": {"fn": "scaffold_vf_qa:bonus", "weight": 0.5}}}}


def registry() -> Any:
    plugins = plugin_set(verifiers=scaffold_verifiers)
    assert not plugins.registry.broken, plugins.registry.broken
    return plugins.registry


def build_task(env: str, **options: Any) -> Any:
    return registry().create("task", "verifiers", {"env": env, **options}, path="task")


def play(task: Any, respond: Any) -> list[Any]:
    """Every row of ``task`` through scaffold's runtime (scripted engine), scored by the default verifier."""
    verifier = registry().create("verifier", "verifiers", {}, path="verifier")
    engine = ScriptedEngine(respond)
    contexts = make_contexts(task, engine.tokenizer, SamplingParams(max_tokens=200, temperature=1.0, seed=1))
    from scaffold_core.builtins.controllers import NativeController

    return run_episodes(contexts, engine=engine, controller=NativeController(samples=3), verifier=verifier,
                        timeout=120)


def library_score(env: str, env_args: dict[str, Any], index: int, completion: str) -> Any:
    """The library scoring ``completion`` on its own: the task from its own taskset, the null harness's
    messages, a trace of that exchange, ``await task.score(trace)`` (what vf-replay does)."""
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

    taskset = load_taskset(taskset_config_type(env).model_validate({**env_args, "id": env}))
    task = list(taskset)[index]
    data = task.data
    prompt = [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt)
    messages = ([vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []) + prompt
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=data, key=task.key, hash=task.hash),
                     agent=AgentInfo(config=vf.AgentConfig()))
    for i, message in enumerate([*messages, vf.AssistantMessage(content=completion)]):
        trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=message,
                                       sampled=message.role == "assistant"))
    asyncio.run(task.score(trace))
    return trace


# -- single-turn environments with a rubric ----------------------------------------------------------------


def test_prompts_are_the_null_harness_messages_few_shot_included():
    arith = build_task("scaffold_vf_arith", env_args={"n": 2})
    rows = arith.load()
    assert [r["id"] for r in rows] == ["sum-1", "sum-2"]
    assert arith.messages(rows[1]) == [{"role": "system", "content": "You are a careful calculator."},
                                       {"role": "user", "content": "What is 2 + 5? End with '#### <answer>'."}]
    qa = build_task("scaffold_vf_qa", limit=1)
    assert qa.messages(qa.load()[0]) == [
        {"role": "system", "content": "Answer with the city only."}, {"role": "user", "content": "Capital of Italy?"},
        {"role": "assistant", "content": "Rome"}, {"role": "user", "content": "Capital of France?"}]


@pytest.mark.parametrize("env, env_args, completions", [
    ("scaffold_vf_arith", {"n": 4}, ["#### {answer}", "#### 0", "It is {answer}."]),
    ("scaffold_vf_qa", BONUS, ["{answer}", "It is {answer}", "Rome"]),
])
def test_rewards_and_each_functions_value_equal_the_librarys_own_scoring(env, env_args, completions):
    """Three completions per task (right, wrong, half right) through scaffold's runtime and verifier pool; the
    same completions scored by the library itself; weighted rewards and every function's value agree."""
    task = build_task(env, env_args=env_args)
    answers = {row["id"]: row["verifiers_task"]["answer"] for row in task.load()}

    def respond(prompt: str, request: Any) -> str:
        row_id = request.request_id.split("/")[0]
        sample = int(request.request_id.split("/")[2])
        return completions[sample].format(answer=answers[row_id])

    results = play(task, respond)
    assert all(r.ok for r in results), [r.error for r in results]
    rewards = set()
    for index, result in enumerate(results):
        for sample in result.samples:
            mine = sample.verdict
            theirs = library_score(env, env_args, index, sample.text)
            assert mine.reward == pytest.approx(theirs.reward), (sample.text, mine, theirs.rewards)
            expected = {f"reward/{k}": r.score for k, r in theirs.rewards.items()}
            expected.update({f"metric/{k}": v for k, v in theirs.metrics.items()})
            assert mine.metrics == pytest.approx(expected)
            rewards.add(mine.reward)
        assert set(result.metrics) >= {k for s in result.samples for k in s.verdict.metrics}
    assert len(rewards) >= 3  # right, wrong and half-right completions really differ


def test_a_run_keeps_each_reward_functions_value_with_the_sample_and_in_metrics(tmp_path):
    sys_path = os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")])
    os.environ["PYTHONPATH"] = sys_path  # a worker process would import the environment too
    plugins = get_plugins()
    if "verifiers" not in plugins.registry.names("task"):
        pytest.skip("scaffold-verifiers is not installed in this environment")
    config = load_config(data={"task": {"name": "verifiers", "env": "scaffold_vf_arith", "env_args": {"n": 3}},
                               "engine": {"name": "benchmark_canned", "response": "#### 4"},
                               "rollout": {"progress": False}}, registry=plugins.registry)
    assert config.verifier.name == "verifiers"
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    assert (metrics["completed"], metrics["failed"]) == (3, 0)
    assert metrics["reward/correct"] == pytest.approx(1 / 3) and metrics["reward/formatted"] == 1.0
    episodes = list(read_records(tmp_path / "run"))
    first = next(e for e in episodes if e["episode_id"] == "sum-1")["samples"][0]
    assert first["reward"] == 1.25 and first["verdict_metrics"] == {"reward/correct": 1.0, "reward/formatted": 1.0,
                                                                     "metric/reply_chars": 6.0}


class TestVerifiersTaskConformance(TaskConformance):
    """The judge-free environment: rows load, prompts build, each answer passes the rubric, wrong ones get 0."""

    plugin = scaffold_verifiers
    name = "verifiers"
    options = {"env": "scaffold_vf_qa"}

    def scaffold_registry(self) -> Any:
        """The task's default controller (verifiers_rollout) formats tools with scaffold-multiturn's formats, a
        dependency of scaffold-verifiers (through scaffold-serve): registered here as an install has it."""
        import scaffold_multiturn
        import scaffold_serve

        plugins = plugin_set(scaffold_multiturn, scaffold_serve, verifiers=scaffold_verifiers)
        assert not plugins.registry.broken, plugins.registry.broken
        return plugins.registry

    def gold_response(self, row: dict[str, Any], reference: Any) -> str:
        return reference["verifiers_task"]["answer"]

    def wrong_responses(self, row, reference, others):
        return ["", "I don't know.", *(o["verifiers_task"]["answer"] for _, o in others[:1])]


def _qa_references() -> list[Any]:
    task = VerifiersTask(env="scaffold_vf_qa")
    return [task.reference(row) for row in task.load()]


class TestVerifiersRubricConformance(VerifierConformance):
    plugin = scaffold_verifiers
    name = "verifiers"
    gold = [(ref["verifiers_task"]["answer"], ref) for ref in _qa_references()]
    wrong = [("Madrid", ref) for ref in _qa_references()] + [("", _qa_references()[0])]
    time_limit = 30.0


# -- what is not single-turn: the library's rollout (tests/test_rollout.py plays them) --------------------------


@pytest.mark.parametrize("env, env_args, why", [
    ("scaffold_vf_tools", {}, "it gives the model tools"),
    ("scaffold_vf_game", {}, "it defines its own Env"),
    ("scaffold_vf_arith", {"task": {"judges": [{"id": "reference"}]}}, "its rubric has judges"),
])
def test_environments_that_need_more_than_one_turn_take_the_librarys_rollout(env, env_args, why):
    """They build, their rows say the library's rollout plays them (with the null harness, in the subprocess
    runtime), and the one-response verifier refuses them in one line naming the controller that can."""
    task = build_task(env, env_args=env_args)
    assert not task.single_turn and any(why in p for p in task.loaded.problems)
    reference = task.reference(task.load()[0])
    assert reference["rollout"] == {"harness": "null", "env_config": {}}
    verifier = registry().create("verifier", "verifiers", {}, path="verifier")
    from scaffold_core.errors import VerifierError

    with pytest.raises(VerifierError, match="use controller: {name: verifiers_rollout}") as info:
        verifier.verify("an answer", reference)
    assert "\n" not in str(info.value)


def test_a_harness_that_runs_the_models_commands_here_is_refused():
    with pytest.raises(ConfigError, match=r"its harness 'bash' runs the model's commands on this machine") as info:
        build_task("scaffold_vf_arith", harness="bash")
    assert "\n" not in str(info.value)


def test_bad_env_config_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match=r"task\.env_config: .*'scaffold_vf_game' rejected its env config") as info:
        build_task("scaffold_vf_game", env_config={"agent": {"max_turns": "many"}})
    assert "\n" not in str(info.value)


def test_the_controller_plays_only_verifiers_rows_and_checks_its_options():
    from scaffold_verifiers.rollout import VerifiersRolloutController

    with pytest.raises(ValueError, match="judge must be 'same'"):
        VerifiersRolloutController(judge="gpt")
    with pytest.raises(ValueError, match="judge.base_url must be an http"):
        VerifiersRolloutController(judge={"base_url": "localhost", "model": "m"})
    controller = VerifiersRolloutController()
    task = build_task("scaffold_vf_qa", limit=1)
    contexts = make_contexts(task, ScriptedEngine().tokenizer, SamplingParams(max_tokens=8))
    contexts[0].reference = "Paris"
    with pytest.raises(ConfigError, match="plays the verifiers task's rows"):
        next(controller.process(contexts[0]))


def test_judges_are_pointed_at_the_endpoint_wherever_the_task_config_holds_them():
    from scaffold_verifiers.judges import JudgeEndpoint, bind_judges, count_judges

    class JudgedConfig(vf.TaskConfig):
        grader: vf.JudgeConfig = vf.JudgeConfig()  # a judge a task's own reward builds

    config = JudgedConfig(judges=[{"id": "reference"}])
    assert count_judges(config) == 2
    bound = bind_judges(config, JudgeEndpoint("http://127.0.0.1:1/sessions/s/v1", "scaffold", "KEY_VAR"))
    for judge in (bound.judges[0], bound.grader):
        assert (judge.base_url, judge.model, judge.api_key_var) == ("http://127.0.0.1:1/sessions/s/v1", "scaffold",
                                                                    "KEY_VAR")
    assert type(bound.judges[0]).__name__ == "ReferenceJudgeConfig" and bound.judges[0].choices == ("yes", "no")
    assert config.grader.base_url != bound.grader.base_url  # the environment's own config is left as it was


def test_the_chat_program_runs_here_only_with_every_package_it_declares():
    from scaffold_verifiers.program import declared_dependencies, missing_dependencies
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

    declared = declared_dependencies(CHAT_PROGRAM_SOURCE)
    assert "openai" in declared and any(d.startswith("mcp") for d in declared)
    assert missing_dependencies(declared) == []
    assert missing_dependencies(["mcp==0.1", "no-such-package-here"]) == ["mcp==0.1 (installed: 2.0.0)",
                                                                          "no-such-package-here"]


def test_bad_ids_and_arguments_are_one_line_config_errors():
    with pytest.raises(ConfigError, match=r"verifiers environment 'no_such_env' could not be loaded") as missing:
        build_task("no_such_env")
    with pytest.raises(ConfigError, match=r"task\.env_args: .*'scaffold_vf_arith' rejected its arguments: "
                                          r"ValidationError: .*nn") as bad:
        build_task("scaffold_vf_arith", env_args={"nn": 3})
    assert "\n" not in str(missing.value) + str(bad.value)


SHIPPED = sorted(m.name for m in pkgutil.iter_modules(__import__("verifiers.v1.tasksets",
                                                                  fromlist=["x"]).__path__))


OPENENV = importlib.util.find_spec("openenv") is not None  # openenv-core (scaffold-openenv's tests install it)
SHIPPED_NEEDS = {"harbor": "container images", "nemo_gym": "NeMo Gym resource server",
                 "openenv": "give env_args.base_url" if OPENENV else "openenv client package",
                 "textarena": "textarena requires nltk and textarena"}


@pytest.mark.parametrize("env", SHIPPED)
def test_every_environment_shipped_with_verifiers_gives_a_one_line_answer(env):
    """The tasksets inside verifiers 0.4 all need something from outside (a game engine package and its data
    downloads, an OpenEnv server or client, NeMo Gym servers, containers): each is refused with one line naming
    what (never a traceback); none is silently run as something else."""
    minimal = {"openenv": {"env": "echo_env"} if OPENENV else {"base_url": "http://127.0.0.1:9"},
               "nemo_gym": {"dataset": "rows.jsonl"}}
    with pytest.raises(ConfigError) as info:
        build_task(env, env_args=minimal.get(env, {}))
    text = str(info.value)
    assert "\n" not in text
    assert "cannot run here" in text or "could not be loaded" in text, text
    assert SHIPPED_NEEDS.get(env, "") in text


# -- training on the embedded engine ---------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.slow
def test_scaffold_train_runs_two_steps_on_a_verifiers_environment(tmp_path, tiny_policy):
    pytest.importorskip("scaffold_trl")
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({
        "task": {"name": "verifiers", "env": "scaffold_vf_qa", "env_args": BONUS},
        "engine": {"name": "transformers", "model": str(tiny_policy), "threads": 1, "max_batch_size": 8},
        "sampling": {"max_tokens": 8, "temperature": 1.0},
        "trainer": {"name": "trl", "max_steps": 2, "num_generations": 2, "prompts_per_step": 2,
                    "micro_batch_size": 4, "learning_rate": 1e-5, "seed": 0, "threads": 1,
                    "filter_groups": "none"},  # a tiny policy's groups may all tie: train on them anyway
    }), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "train", str(config), "-o", str(tmp_path / "run"),
                          "--no-progress"], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "train_metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(math.isfinite(s["loss"]) and 0.0 <= s["reward_mean"] <= 1.5 for s in steps), steps
