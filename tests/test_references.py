"""Verifier references are any JSON value, end to end; verdicts outside a verifier's reward_range fail episodes."""

from __future__ import annotations

import json
import math

import pytest
from scaffold_testkit import ListTask, plugin_set

from scaffold_core import Verdict, hookimpl
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.config import load_config
from scaffold_core.errors import InvalidVerdictError
from scaffold_core.output import read_records
from scaffold_core.run.rollout import Rollout
from scaffold_core.verifier import check_verdict, reference_answers, reward_range_of


class AnyOfTask(ListTask):
    """Rows whose reference is a list of acceptable answers (or a number)."""

    default_config = {"verifier": {"name": "exact_match"}}

    def __init__(self):
        super().__init__([{"id": "a", "question": "Capital of France?", "answer": ["Paris", "paris"]},
                          {"id": "b", "question": "Six times seven?", "answer": 42},
                          {"id": "c", "question": "Colour of the sky?", "answer": ["blue", "azure"]}])

    def reference(self, row):
        return row["answer"]


class OverReward:
    """Gives 2.0 for a right answer, more than the default reward_range (0, 1) allows."""

    def verify(self, response, reference):
        return Verdict(2.0 if response.strip() in reference_answers(reference) else 0.0, response, None, "")


class DeclaredRange(OverReward):
    reward_range = (0.0, 2.0)


class Plugin:
    @hookimpl
    def register_tasks(self, registry):
        registry.add("anyof", AnyOfTask)

    @hookimpl
    def register_verifiers(self, registry):
        registry.add("over", OverReward)
        registry.add("declared", DeclaredRange)


@pytest.fixture(scope="module")
def plugins():
    return plugin_set(refs=Plugin())


def run(plugins, tmp_path, **sections):
    data = {"task": {"name": "anyof"}, "engine": {"name": "benchmark_canned", "response": "42"},
            "sampling": {"max_tokens": 8}, **sections}
    config = load_config(data=data, registry=plugins.registry)
    metrics = Rollout(config, output_dir=tmp_path / "out", plugins=plugins, progress=False).run()
    episodes = list(read_records(tmp_path / "out"))
    return metrics, {e["episode_id"]: e for e in episodes}


def test_reference_answers_reads_the_common_shapes():
    assert reference_answers("18") == ["18"] and reference_answers(18) == ["18"] and reference_answers(None) == []
    assert reference_answers(["18", 18.5]) == ["18", "18.5"]
    for bad in ({"value": 18}, True, [["18"]]):
        with pytest.raises(ValueError, match="not an answer or a list of answers"):
            reference_answers(bad)


def test_exact_match_takes_lists_and_numbers_and_refuses_dicts():
    verifier = ExactMatchVerifier()
    assert verifier.verify("azure", ["blue", "azure"]).reward == 1.0
    assert verifier.verify("green", ["blue", "azure"]).reward == 0.0
    assert verifier.verify("42", 42).reward == 1.0
    with pytest.raises(ValueError, match="dict inside"):
        verifier.verify("9.81", {"value": 9.81, "tolerance": 0.01})


def test_structured_references_run_end_to_end_and_are_saved_as_json(plugins, tmp_path):
    metrics, episodes = run(plugins, tmp_path)
    assert metrics["completed"] == 3 and metrics["failed"] == 0
    assert episodes["b"]["samples"][0]["reward"] == 1.0  # "42" against the number 42
    assert episodes["a"]["answer"] == ["Paris", "paris"] and episodes["b"]["answer"] == 42
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert {s["answer"] if not isinstance(s["answer"], list) else tuple(s["answer"]) for s in samples} == {
        ("Paris", "paris"), 42, ("blue", "azure")}


def test_scaffold_score_passes_json_references_as_they_are(tmp_path, cli):
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in [
        {"response": "azure", "answer": ["blue", "azure"]},
        {"response": "42", "answer": 42},
        {"response": "41", "answer": [40, 42]},
        {"response": "x", "answer": None},
    ]) + "\n")
    proc = cli("score", "--verifier", "exact_match", "--input", str(source), "--output", str(tmp_path / "out.jsonl"))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, None]  # no reference: no reward, never a 0
    assert rows[3]["scored"] is False and "scored" not in rows[0]
    summary = json.loads(proc.stdout)
    assert summary["scored"] == 3 and summary["no_reward"] == [{"line": 4, "reason": rows[3]["reason"]}]
    assert "1 line(s) got no reward" in proc.stderr
    assert rows[0]["answer"] == ["blue", "azure"]  # written back unchanged


def test_a_reward_outside_the_declared_range_fails_the_episode(plugins, tmp_path):
    metrics, episodes = run(plugins, tmp_path, verifier={"name": "over"})
    assert metrics["failed"] == 1 and metrics["completed"] == 2  # only "b" is answered right (reward 2.0)
    failed = episodes["b"]
    assert failed["status"] == "failed" and failed["error_component"] == "verifier"
    assert "gave reward 2.0" in failed["error"] and "outside its reward_range (0, 1)" in failed["error"]
    assert "reward_range = (low, high)" in failed["error"]


def test_a_declared_range_is_honoured(plugins, tmp_path):
    metrics, episodes = run(plugins, tmp_path, verifier={"name": "declared"})
    assert metrics["failed"] == 0 and episodes["b"]["samples"][0]["reward"] == 2.0


@pytest.mark.parametrize("reward", [math.nan, math.inf, -0.5, 1.5, True, "1"])
def test_check_verdict_refuses_unusable_rewards(reward):
    with pytest.raises(InvalidVerdictError, match="outside its reward_range"):
        check_verdict(ExactMatchVerifier(), Verdict(reward), "response", "ref")


@pytest.mark.parametrize("declared", [(1.0, 0.0), (0.0,), "01", (0.0, math.inf)])
def test_a_malformed_reward_range_is_named(declared):
    class Odd(ExactMatchVerifier):
        reward_range = declared

    with pytest.raises(ValueError, match="reward_range"):
        reward_range_of(Odd())
