"""The simulated_user environment: a second engine plays the user, started and closed with the run."""

from __future__ import annotations

import re
import time

import pytest
import yaml
from mt_helpers import controller, registry, run
from scaffold_testkit import ListTask, ScriptedEngine, plugin_set

from scaffold_core import hookimpl
from scaffold_core.config import load_config
from scaffold_core.errors import ConfigError
from scaffold_core.output import read_records
from scaffold_core.run.rollout import Rollout

ROWS = [{"id": f"q{i}", "question": f"What is {i} + 2?", "answer": str(i + 2)} for i in range(4)]


def user_reply(prompt: str, request) -> str:
    """The user model: satisfied when the tutor's last message holds the right sum, else asks again."""
    a = int(re.search(r"What is (\d+) \+ 2\?", prompt).group(1))
    last = prompt.rsplit("<|user|>\n", 1)[1].split("<|end|>", 1)[0]
    return "[DONE]" if last.strip() == str(a + 2) else f"Hmm, are you sure about {a} + 2?"


def tutor(prompt: str, request) -> str:
    """The model under training: wrong the first time, right once the user pushes back."""
    a = int(re.search(r"What is (\d+) \+ 2\?", prompt).group(1))
    return str(a + 2) if "are you sure" in prompt else str(a + 3)


class UserEngines:
    """Registers engines for the simulated user and remembers every instance built."""

    built: list = []

    @hookimpl
    def register_engines(self, registry):
        def scripted_user(hang: bool = False) -> ScriptedEngine:
            engine = ScriptedEngine(user_reply, delay=(0.0, 0.003), hang=(lambda p: True) if hang else None)
            UserEngines.built.append(engine)
            return engine

        registry.add("scripted_user", scripted_user)

    @hookimpl
    def register_tasks(self, registry):
        registry.add("sums", lambda: ListTask(ROWS))


def user_controller(**env):
    return controller(registry(UserEngines()), max_turns=4,
                      environment={"name": "simulated_user", "engine": {"name": "scripted_user"}, **env})


def test_the_user_model_reads_the_assistant_turns_and_ends_the_conversation():
    UserEngines.built = []
    ctrl = user_controller()
    user = ctrl.environment.engine
    results = run(ListTask(ROWS), ScriptedEngine(tutor), ctrl)
    assert user.started and user.closed  # started with the run, closed at its end
    for row, result in zip(ROWS, results):
        assert result.ok, result.error
        sample = result.samples[0]
        assert sample.metadata["end"] == "done" and result.metrics["turns"] == 2.0
        answer = str(int(row["answer"]))
        assert sample.text == answer and sample.reward == 1.0
        said = [m["content"] for m in sample.metadata["messages"] if m["role"] == "user"]
        assert said == [f"Hmm, are you sure about {int(row['answer']) - 2} + 2?"]
    # the user model saw its instructions with the question, the tutor's turns as user messages
    first = user.tokenizer.decode(user.requests[0].prompt_ids)
    assert first.startswith("<|system|>\nYou are a student talking to a tutor about this question:")
    assert re.search(r"<\|user\|>\n\d+<\|end|>\n<\|assistant\|>\n$", first)
    assert len(user.requests) == 2 * len(ROWS)
    assert len({r.seed for r in user.requests}) == len(user.requests)


def test_stop_when_correct_ends_on_the_verifiers_word_without_asking_the_user():
    ctrl = user_controller(stop_when_correct=True)
    results = run(ListTask(ROWS), ScriptedEngine(lambda p, r: str(int(re.search(r"(\d+) \+", p).group(1)) + 2)),
                  ctrl)
    assert all(r.ok and r.metrics["turns"] == 1.0 and r.samples[0].reward == 1.0 for r in results)
    assert ctrl.environment.engine.requests == []


def test_a_hanging_user_engine_fails_the_episode_within_its_timeout():
    ctrl = controller(registry(UserEngines()), max_turns=3, environment={
        "name": "simulated_user", "engine": {"name": "scripted_user", "hang": True}, "request_timeout": 0.2})
    started = time.perf_counter()
    results = run(ListTask(ROWS[:2]), ScriptedEngine(tutor), ctrl, timeout=30)
    assert time.perf_counter() - started < 20
    for result in results:
        assert result.status == "failed" and result.error_component == "environment"
        assert "simulated user's engine 'scripted_user' did not finish within 0.2 s" in result.error
    assert ctrl.environment.engine.closed


def test_scaffold_run_validates_starts_and_closes_the_user_engine(tmp_path):
    plugins = plugin_set(multiturn=__import__("scaffold_multiturn"), users=UserEngines())
    text = """
task: {name: sums}
controller:
  name: multiturn_chat
  max_turns: 3
  environment: {name: simulated_user, engine: {name: scripted_user}}
engine: {name: benchmark_canned, response: '99'}
verifier: {name: exact_match}
trajectory: {name: multiturn}
sampling: {max_tokens: 8}
rollout: {progress: false}
"""
    config = load_config(data=yaml.safe_load(text), registry=plugins.registry)
    UserEngines.built = []
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    assert metrics["completed"] == 4 and metrics["turns"] == 3.0 and metrics["drift"] == 0.0
    (user,) = [e for e in UserEngines.built if e.requests]
    assert user.started and user.closed and len(user.requests) == 4 * 2  # not asked after the last turn
    episode = next(read_records(tmp_path / "run"))
    assert episode["samples"][0]["metadata"]["environment"] == "simulated_user"
    bad = yaml.safe_load(text)
    bad["controller"]["environment"]["engine"] = {"name": "scripted_usr"}
    with pytest.raises(ConfigError, match="unknown engine 'scripted_usr'.*Did you mean 'scripted_user'"):
        load_config(data=bad, registry=plugins.registry)


@pytest.mark.model
def test_smollm2_plays_the_user_of_smollm2(smollm2_engine):
    """The embedded transformers engine, configured like the main one, as the simulated user."""
    ctrl = controller(registry(), max_turns=2, environment={
        "name": "simulated_user", "engine": {"name": "transformers", "threads": 1}, "max_tokens": 8,
        "temperature": 0.0})
    task = ListTask([{"id": "s", "question": "What is 2 + 2? Answer with a number.", "answer": "4"}])
    result = run(task, smollm2_engine, ctrl, max_tokens=8, temperature=0.0, timeout=600)[0]
    assert result.ok, result.error
    sample = result.samples[0]
    user = ctrl.environment.engine
    assert user is not smollm2_engine.engine and user.stats()["rows"] == 1  # its own engine answered once
    assert ctrl.environment._loop is None  # closed with the run
    if sample.metadata["end"] != "done":  # the user model asked something: its words are the environment turn
        (said,) = [m["content"] for m in sample.metadata["messages"] if m["role"] == "user"]
        assert said and "[DONE]" not in said
        assert result.metrics["turns"] == 2.0
    assert result.metrics["drift"] == 0.0
