"""The conformance kit run against the core's built-in components (and the test kit's ScriptedEngine)."""

from __future__ import annotations

import scaffold_testkit.plugin as test_tasks
from scaffold_testkit import ScriptedEngine
from scaffold_testkit.conformance import (
    ControllerConformance,
    EngineConformance,
    TaskConformance,
    TrajectoryMakerConformance,
    VerifierConformance,
)


class TestExactMatch(VerifierConformance):
    name = "exact_match"
    gold = [("42", "42"), ("  Paris\n", "Paris"), ("x = 1", "x = 1"), ("azure", ["blue", "azure"]), ("7", 7)]
    wrong = [("41", "42"), ("paris", "Paris"), ("", "42"), ("green", ["blue", "azure"])]
    list_references = True


class TestExactMatchIgnoringCase(VerifierConformance):
    name = "exact_match"
    options = {"ignore_case": True}
    gold = [("paris", "Paris"), ("STRASSE", "strasse")]
    wrong = [("Lyon", "Paris")]
    list_references = True


class TestArithmeticTestTask(TaskConformance):
    """The test kit's own tasks (scaffold_testkit.plugin) keep the task contract."""

    plugin = test_tasks
    name = "arithmetic"
    options = {"count": 6}


class TestListTestTask(TaskConformance):
    plugin = test_tasks
    name = "list"
    options = {"rows": [{"id": "a", "question": "What is 1 + 1?", "answer": "2"},
                        {"id": "b", "question": "Capital of France?", "answer": "Paris"}]}


class TestNativeController(ControllerConformance):
    name = "native"


class TestNativeControllerManySamples(ControllerConformance):
    name = "native"
    options = {"samples": 3}


class TestMajorityVote(ControllerConformance):
    name = "majority_vote"
    options = {"samples": 4}


class TestBestOfN(ControllerConformance):
    name = "best_of_n"
    options = {"samples": 3, "generator": {"name": "native", "samples": 2}}


class TestRepeat(ControllerConformance):
    name = "repeat"
    options = {"n": 3}


class TestRepeatOfAVote(ControllerConformance):
    name = "repeat"
    options = {"n": 2, "controller": {"name": "majority_vote", "samples": 3}}


class TestSingleTurn(TrajectoryMakerConformance):
    name = "single_turn"


class TestGRPO(TrajectoryMakerConformance):
    name = "grpo"


class TestDrGRPO(TrajectoryMakerConformance):
    name = "grpo"
    options = {"std": "none"}


class TestRLOO(TrajectoryMakerConformance):
    name = "grpo"
    options = {"baseline": "leave_one_out", "std": "none", "missing_reward": "fail"}


def _counting(prompt: str, request) -> str:
    return "one, two, three, four, five, six, seven, eight, nine, ten"


class TestScriptedEngine(EngineConformance):
    """The test kit's own engine keeps the engine contract it helps others check."""

    def make_engine(self):
        return ScriptedEngine(_counting, delay=(0.0, 0.002))

