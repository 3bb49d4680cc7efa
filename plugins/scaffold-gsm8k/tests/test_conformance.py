"""scaffold-gsm8k against scaffold's conformance kit: the task and both verifiers keep their contracts."""

from __future__ import annotations

import importlib.util

import pytest
from scaffold_testkit.conformance import TaskConformance, VerifierConformance

import scaffold_gsm8k


class TestGSM8KTaskConformance(TaskConformance):
    """The bundled offline sample: rows load, prompts build, each gold solution passes the gsm8k verifier."""

    plugin = scaffold_gsm8k
    name = "gsm8k"
    options = {"source": "sample", "limit": 20}

    def gold_response(self, row, reference):
        return row["answer"]  # the dataset's worked solution, ending in "#### <number>"


class TestGSM8KTaskWithFewShotConformance(TestGSM8KTaskConformance):
    options = {"source": "sample", "limit": 5, "few_shot": 2}


class TestMultiTurnGSM8KTaskConformance(TestGSM8KTaskConformance):
    """The conversation variant: the same rows; its defaults name scaffold-multiturn's components, which the
    registry holds too (they resolve by name: this plugin imports nothing of them)."""

    name = "multiturn_gsm8k"

    def scaffold_registry(self):
        from scaffold_testkit import plugin_set

        named = {"multiturn": pytest.importorskip("scaffold_multiturn"), "tools": pytest.importorskip("scaffold_tools")}
        return plugin_set(gsm8k=scaffold_gsm8k, **named).registry


class TestGSM8KCalculatorTaskConformance(TestMultiTurnGSM8KTaskConformance):
    name = "gsm8k_calculator"


class TestGSM8KVerifierConformance(VerifierConformance):
    plugin = scaffold_gsm8k
    name = "gsm8k"
    gold = [("She has 48 - 15 = 33 left.\n#### 33", "33"), ("#### 1,234", "1234"), ("\\boxed{18.00}", "18"),
            ("The answer is #### -7", "-7"), ("#### 12", ["12", "12.0"]), ("#### 5", 5)]
    wrong = [("#### 34", "33"), ("She has 33 left.", "33"), ("#### 33.5", "33"), ("#### 13", ["12", 14])]
    list_references = True


class TestGSM8KFlexibleVerifierConformance(VerifierConformance):
    plugin = scaffold_gsm8k
    name = "gsm8k"
    options = {"mode": "flexible"}
    gold = [("She has 33 left.", "33"), ("#### 33", "33")]
    wrong = [("She has 34 left.", "33"), ("no number here", "33")]
    list_references = True


@pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                    reason="math_verify is an optional extra: pip install 'scaffold-gsm8k[math-verify]'")
class TestMathVerifyVerifierConformance(VerifierConformance):
    plugin = scaffold_gsm8k
    name = "math_verify"
    gold = [("#### 33", "33"), ("\\boxed{\\frac{1}{2}}", "0.5")]
    wrong = [("#### 34", "33")]
    time_limit = 30.0
    list_references = True
