"""The gsm8k verifier's verdicts, and the optional math_verify verifier."""

from __future__ import annotations

import asyncio
import importlib.util
import threading

import pytest

import scaffold_gsm8k
from scaffold_core.config import load_config
from scaffold_core.errors import ConfigError
from scaffold_core.testing import plugin_set
from scaffold_core.verifier import Verdict, VerifierPool
from scaffold_gsm8k.verifier import GSM8KVerifier, reference_key

HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None


@pytest.fixture(scope="module")
def strict():
    return GSM8KVerifier()


@pytest.fixture(scope="module")
def registry():
    return plugin_set(gsm8k=scaffold_gsm8k).registry


def test_correct_answer(strict):
    verdict = strict.verify("9 * 2 = 18 dollars a day.\n#### 18", "18")
    assert verdict == Verdict(1.0, "18", "18", "correct (####)")


def test_wrong_answer_names_both_numbers(strict):
    verdict = strict.verify("#### 17", "18")
    assert (verdict.reward, verdict.extracted, verdict.key) == (0.0, "17", "17")
    assert "got 17" in verdict.reason and "expected 18" in verdict.reason


@pytest.mark.parametrize("response, reference", [
    ("#### 18.00", "18"),
    ("#### $1,000", "1000"),
    ("#### 1000", "1,000"),
    ("#### -3", "-3"),
    ("#### 18 dollars.", "18"),
    ("\\boxed{18}", "18"),
    ("#### 0.5", "1/2"),
])
def test_equal_numbers_score(strict, response, reference):
    assert strict.verify(response, reference).reward == 1.0


@pytest.mark.parametrize("response", ["", "The answer is 18", "####", "#### 18 or 19", "#### eighteen",
                                      "#### 17\n#### 18 19", "\\boxed{}"])
def test_no_answer_scores_zero_with_a_reason(strict, response):
    verdict = strict.verify(response, "18")
    assert verdict.reward == 0.0 and verdict.key is None
    assert verdict.reason.startswith("no answer: ")


def test_flexible_mode(strict):
    flexible = GSM8KVerifier(mode="flexible")
    assert strict.verify("so she makes 18 dollars", "18").reward == 0.0
    verdict = flexible.verify("so she makes 18 dollars", "18")
    assert (verdict.reward, verdict.reason) == (1.0, "correct (last number)")


def test_keys_vote_together(strict):
    keys = {strict.verify(r, "18").key for r in ("#### 18", "#### 18.00", "#### $18.", "\\boxed{18.0}")}
    assert keys == {"18"}


def test_reference_may_be_a_worked_solution(strict):
    assert strict.verify("#### 18", "9 * 2 = <<9*2=18>>18\n#### 18").reward == 1.0
    assert reference_key("#### 1,600") == "1600"


@pytest.mark.parametrize("reference", [None, "", "eighteen", "#### ", "18 or 19"])
def test_unusable_reference_raises_instead_of_scoring_zero(strict, reference):
    with pytest.raises(ValueError, match="reference answer|no reference"):
        strict.verify("#### 18", reference)


def test_mode_is_validated(registry):
    with pytest.raises(ConfigError, match="verifier.mode"):
        load_config(data={"task": {"name": "gsm8k", "source": "sample"}, "engine": {"name": "benchmark_canned"},
                          "verifier": {"name": "gsm8k", "mode": "lenient"}}, registry=registry)


def test_runs_in_the_core_verifier_pool(strict):
    async def main():
        pool = VerifierPool(strict, timeout=10, workers=2, name="gsm8k")
        try:
            return await pool.verify_many([("#### 18", "18"), ("#### 3", "4")])
        finally:
            pool.close()

    assert [v.reward for v in asyncio.run(main())] == [1.0, 0.0]


def test_math_verify_is_registered_only_when_installed(registry):
    assert ("math_verify" in registry.names("verifier")) == HAS_MATH_VERIFY
    assert "gsm8k" in registry.names("verifier")


# -- math_verify ---------------------------------------------------------------

needs_math_verify = pytest.mark.skipif(not HAS_MATH_VERIFY, reason='needs: pip install "scaffold-gsm8k[math-verify]"')


@needs_math_verify
def test_math_verify_scores_equivalent_forms():
    from scaffold_gsm8k.math_verify_verifier import MathVerifyVerifier

    verifier = MathVerifyVerifier()
    assert verifier.executor == "process"
    assert verifier.verify("#### 18", "18").reward == 1.0
    assert verifier.verify("so \\boxed{\\frac{36}{2}}", "18").reward == 1.0
    assert verifier.verify("#### 1,600", "1600").reward == 1.0
    assert verifier.verify("#### 17", "18").reward == 0.0
    # the same anchored policy as gsm8k: a number that is not in the answer position does not count
    verdict = verifier.verify("it is 18", "18")
    assert verdict.reward == 0.0 and verdict.reason.startswith("no answer")
    assert verifier.verify("#### 18\n####", "18").reward == 0.0


@needs_math_verify
def test_math_verify_works_off_the_main_thread():
    from scaffold_gsm8k.math_verify_verifier import MathVerifyVerifier

    verifier = MathVerifyVerifier()
    out = []
    thread = threading.Thread(target=lambda: out.append(verifier.verify("#### 18", "18")))
    thread.start()
    thread.join(60)
    assert out and out[0].reward == 1.0


@needs_math_verify
def test_math_verify_runs_in_killable_worker_processes(registry):
    verifier = registry.create("verifier", "math_verify", {})

    async def main():
        pool = VerifierPool(verifier, timeout=60, workers=1, name="math_verify")
        try:
            assert pool.mode == "process"
            return await pool.verify_many([("#### 18", "18"), ("\\boxed{0.5}", "1/2"), ("#### 7", "8")])
        finally:
            pool.close()

    assert [v.reward for v in asyncio.run(main())] == [1.0, 1.0, 0.0]
