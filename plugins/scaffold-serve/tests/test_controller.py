"""The openai_agent controller under `scaffold run` (Rollout) on a scripted engine: agent code as users write it
becomes episodes, trajectories, datasets and metrics like any controller's."""

from __future__ import annotations

import math

import pytest
import scaffold_testkit.plugin as test_tasks
from scaffold_testkit import plugin_set
from serve_helpers import TrackingEngine

import scaffold_multiturn
import scaffold_serve
from scaffold_core import hookimpl
from scaffold_core.config import load_config
from scaffold_core.errors import ConfigError
from scaffold_core.output import read_records
from scaffold_core.run.rollout import Rollout

ROWS = [{"id": "add", "question": "Add 2 and 3.", "answer": "The answer is 5."},
        {"id": "hi", "question": "Hi", "answer": "Hello there."}]


class Engines:
    @hookimpl
    def register_engines(self, registry):
        registry.add("scripted_tools", TrackingEngine)


@pytest.fixture(scope="module")
def pset():
    return plugin_set(test_tasks, scaffold_multiturn, scaffold_serve, Engines())


def run(pset, tmp_path, controller, **sections):
    config = load_config(data={
        "task": {"name": "list", "rows": ROWS}, "controller": controller, "engine": {"name": "scripted_tools"},
        "sampling": {"max_tokens": 256}, "trajectory": {"name": "multiturn"}, **sections,
    }, registry=pset.registry)
    out = tmp_path / "run"
    metrics = Rollout(config, output_dir=out, plugins=pset, progress=False).run()
    episodes = {e["episode_id"]: e for e in read_records(out)}
    return metrics, episodes, out


def agent(entry, **options):
    return {"name": "openai_agent", "entry": f"agents_for_tests:{entry}", **options}


def test_scaffold_run_turns_an_agent_into_trajectories(pset, tmp_path):
    datasets = pytest.importorskip("datasets")
    metrics, episodes, out = run(pset, tmp_path, agent("tool_agent"))
    assert metrics["episodes"] == 2 and metrics["failed"] == 0, metrics
    assert metrics["reward_mean"] == 1.0 and metrics["drift"] == 0.0
    assert episodes["add"]["metrics"]["agent_calls"] == 2.0 and episodes["hi"]["metrics"]["agent_calls"] == 1.0
    rows = {r["episode_id"]: r for r in datasets.load_from_disk(str(out / "trajectories"))}
    add = rows["add"]
    tokenizer = TrackingEngine().tokenizer
    trained = tokenizer.decode([t for t, m in zip(add["input_ids"], add["loss_mask"]) if m])
    masked = tokenizer.decode([t for t, m in zip(add["input_ids"], add["loss_mask"]) if not m])
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in trained
    assert "The answer is 5." in trained and "<tool_response>\n5\n</tool_response>" in masked
    assert len(add["turn_starts"]) == 2 and add["reward"] == 1.0
    assert all(v == 0 for v, m in zip(add["versions"], add["loss_mask"]) if m)
    assert all(lp < 0 for lp, m in zip(add["logprobs"], add["loss_mask"]) if m)  # the engine's, no placeholders


def test_majority_vote_branches_each_get_their_own_session(pset, tmp_path):
    controller = {"name": "majority_vote", "samples": 3, "generator": agent("sync_agent")}
    metrics, episodes, _ = run(pset, tmp_path, controller)
    assert metrics["failed"] == 0
    samples = episodes["hi"]["samples"]
    sessions = {s["metadata"]["session"] for s in samples}
    assert len(samples) == 3 and len(sessions) == 3
    assert episodes["hi"]["metrics"]["maj@3"] == 1.0


def test_a_posted_reward_wins_and_no_answer_is_never_zero(pset, tmp_path):
    metrics, episodes, _ = run(pset, tmp_path, agent("rewarding_agent"))
    assert {s["reward"] for e in episodes.values() for s in e["samples"]} == {0.25}
    metrics, episodes, out = run(pset, tmp_path / "2", agent("answerless_agent"))
    assert metrics["failed"] == 0 and metrics.get("unscored_samples") == 2, metrics
    assert all(math.isnan(s["reward"]) for e in episodes.values() for s in e["samples"])  # unscorable, not 0
    trajectories = out / "trajectories"
    assert not trajectories.exists() or len(pytest.importorskip("datasets").load_from_disk(str(trajectories))) == 0


def test_concurrent_calls_of_one_agent_are_all_recorded(pset, tmp_path):
    metrics, episodes, _ = run(pset, tmp_path, agent("parallel_agent"))
    assert metrics["failed"] == 0
    assert all(len(e["samples"]) == 3 and e["metrics"]["agent_calls"] == 3.0 for e in episodes.values())


@pytest.mark.parametrize("entry, reason", [
    ("silent_agent", "without a chat completion call"),
    ("broken_agent", "raised ValueError: the agent gave up"),
    ("wrong_model_agent", "does not exist here"),
])
def test_a_failing_agent_fails_its_episode_with_the_reason(pset, tmp_path, entry, reason):
    metrics, episodes, _ = run(pset, tmp_path, agent(entry))
    assert metrics["failed"] == 2
    for episode in episodes.values():
        assert episode["status"] == "failed" and episode["error_component"] == "agent"
        assert reason in episode["error"]


def test_bad_options_fail_before_anything_runs(pset):
    for options, message in (({"entry": "no colon"}, "entry must be"), ({"entry": "m:f", "samples": 0}, "samples"),
                             ({"entry": "m:f", "sampling": "mine"}, "sampling"),
                             ({"entry": "m:f", "tool_format": "nope"}, "nope")):
        with pytest.raises(ConfigError, match=message):
            load_config(data={"task": {"name": "list", "rows": ROWS}, "engine": {"name": "scripted_tools"},
                              "controller": {"name": "openai_agent", **options}}, registry=pset.registry)


def test_the_example_runs_its_agent_on_the_canned_engine(tmp_path, monkeypatch):
    """examples/openai-agent.yaml as `scaffold run` sees it (the canned engine instead of the model)."""
    from pathlib import Path

    from scaffold_core.plugins import get_plugins

    repo = Path(__file__).resolve().parents[3]
    plugins = get_plugins()
    if "gsm8k" not in plugins.registry.names("task"):
        pytest.skip("needs scaffold-gsm8k installed")
    monkeypatch.chdir(repo)  # the entry is a path relative to the working directory
    config = load_config(repo / "examples" / "openai-agent.yaml",
                         ["engine.name=benchmark_canned", "task.limit=2"], registry=plugins.registry)
    assert config.controller.name == "openai_agent" and config.task.options["source"] == "sample"
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins, progress=False).run()
    assert metrics["episodes"] == 2 and metrics["failed"] == 0 and metrics["agent_calls"] == 1.0
    assert (tmp_path / "run" / "trajectories").is_dir()


def test_a_smolagents_agent_with_its_defaults_is_one_episode_per_row(pset, tmp_path, caplog):
    """smolagents resends every step as rewritten text: each run splits into several samples, but an episode is still
    one row, its runs count once each in pass@k and reward_mean, and the drift is reported (and warned about once)."""
    pytest.importorskip("smolagents")
    with caplog.at_level("WARNING", logger="scaffold_serve"):
        metrics, episodes, _ = run(pset, tmp_path, agent("smolagents_agent", samples=2))
    assert metrics["episodes"] == 2 and metrics["failed"] == 0 and len(episodes) == 2, metrics
    assert metrics["samples"] == 6 and metrics["rollouts"] == 4  # "add": 2 runs x 2 samples; "hi": 2 runs x 1
    assert metrics["pass@2"] == 0.5 and "pass@4" not in metrics and "pass@3" not in metrics
    assert metrics["reward_mean"] == 0.5  # (1 + 1 + 0 + 0) / 4 runs, not 4/6 samples
    assert episodes["add"]["metrics"]["drift"] == 1.0 and episodes["hi"]["metrics"]["drift"] == 0.0
    assert metrics["drift"] == 0.5
    warned = [r for r in caplog.records if "rewrote history" in r.getMessage()]
    assert len(warned) == 1 and "Observation" in warned[0].getMessage()
    assert episodes["add"]["prompt"].startswith("<|system|>") and "New task:\nAdd 2 and 3." in episodes["add"]["prompt"]


def test_an_engine_that_cannot_constrain_answers_the_agent_a_400(pset, tmp_path):
    """Under `scaffold run` the engine is the run's: one that cannot constrain refuses the forced call with a 400 the
    agent can handle (never generated unconstrained), and the episode goes on."""
    metrics, episodes, _ = run(pset, tmp_path, agent("forcing_agent"), engine={"name": "benchmark_canned"})
    assert metrics["failed"] == 0, metrics
    answer = episodes["add"]["final_answer"]
    assert answer.startswith("refused: ") and "cannot constrain decoding" in answer and "benchmark_canned" in answer
