"""The gsm8k verifier's verdicts, and the optional math_verify verifier."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import threading
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scaffold_testkit import plugin_set

import scaffold_gsm8k
from scaffold_core.config import load_config
from scaffold_core.errors import ConfigError
from scaffold_core.run.verifier_pool import VerifierPool
from scaffold_core.verifier import Verdict
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


# -- near misses: answers that start with the gold number but state another value ----------------

MATH_VERIFY = None
if HAS_MATH_VERIFY:
    from scaffold_gsm8k.math_verify_verifier import MathVerifyVerifier

    MATH_VERIFY = MathVerifyVerifier()

VERIFIERS = {"gsm8k": GSM8KVerifier(), "gsm8k flexible": GSM8KVerifier(mode="flexible"), "math_verify": MATH_VERIFY}
ALL_VERIFIERS = pytest.mark.parametrize("name", [
    "gsm8k", "gsm8k flexible", pytest.param("math_verify", marks=needs_math_verify)])

# Each states a value other than the gold 5 (or no value at all): reward 0 from every verifier.
WRONG_FOR_5 = [
    "#### 5^{100}", "\\boxed{5^{2}}", "#### 5!", "#### 5^2", "#### 5/2", "#### 5x", "#### 5 \\times 3", "#### 55",
    "#### 5.5", "#### -5", "#### 5e3", "#### 5E3", "#### 5 thousand", "#### 5k", "#### 5m", "#### 5\\pi",
    "#### \\sqrt{5}", "#### \\sqrt{5}^{2} + 20", "#### 5 + x", "#### x \\neq 5", "#### x >= 5", "#### - 5",
    "#### 5\u00b2", "#### \u221a5", "#### 5 and a half", "#### 5 x", "#### e^5", "#### 5 \\cdot x", "#### x * 5",
    "#### 5_{7}", "#### 5 5", "#### 5(5)", "#### 5{5}", "#### \\frac{10}{2}2", "#### 5'5", "#### 5,5",
    "#### 5\\ldots5", "#### 5^\\circ 0", "#### 5 \\text{ thousand}", "#### 5\\text{k}", "#### 5:00", "#### 18 or 5",
    "#### **5**!", "The answer is \\boxed{5!}.", "#### $5^{2}$", "#### \\(5^2\\)", "#### 5 squared", "#### 5,000",
]
# Each states 5 (or a value that truly equals 5): reward 1 from the strict gsm8k verifier and math_verify.
RIGHT_FOR_5 = [
    "#### 5", "#### 5.0", "#### 5.00", "\\boxed{5}", "#### $5", "#### \\$5", "#### 5 dollars", "#### 5 dollars.",
    "#### **5**", "#### The answer is 5.", "#### x = 5", "#### 2 + 3 = 5", "#### \\frac{10}{2}", "#### 10/2",
    "#### 5%", "#### 5\\%", "#### 5 km", "#### 5kg", "#### 5th", "#### 5 dozen", "#### 5/hour", "#### \\text{5 apples}",
    "#### \\boxed{5}", "$\\boxed{5}$",
]
# Truly 5 as an expression: math_verify scores it, the gsm8k verifier (one plain number) does not.
EXPRESSIONS_FOR_5 = ["#### 2 + 3", "#### \\sqrt{25}", "#### 10 \\div 2", "#### \\frac{15}{3} \\cdot 1", "#### 5^{1}",
                     "#### (2 + 3) dollars", "\\boxed{\\dfrac{25}{5} \\cdot 1}"]


@ALL_VERIFIERS
@pytest.mark.parametrize("response", WRONG_FOR_5)
def test_near_misses_of_the_gold_score_zero(name, response):
    verdict = VERIFIERS[name].verify(response, "5")
    assert verdict.reward == 0.0, verdict


@pytest.mark.parametrize("name", ["gsm8k", pytest.param("math_verify", marks=needs_math_verify)])
@pytest.mark.parametrize("response", RIGHT_FOR_5)
def test_the_gold_in_its_usual_dress_scores(name, response):
    verdict = VERIFIERS[name].verify(response, "5")
    assert verdict.reward == 1.0, verdict


@needs_math_verify
@pytest.mark.parametrize("response", EXPRESSIONS_FOR_5)
def test_math_verify_scores_expressions_that_equal_the_gold(response):
    assert MATH_VERIFY.verify(response, "5").reward == 1.0
    assert VERIFIERS["gsm8k"].verify(response, "5").reward == 0.0


@needs_math_verify
def test_math_verify_compares_the_whole_expression():
    assert MATH_VERIFY.verify("#### 5!", "120").reward == 1.0  # 5! is 120, not 5
    assert MATH_VERIFY.verify("#### 5^{2}", "25").reward == 1.0
    assert MATH_VERIFY.verify("#### 5,000", "5000").reward == 1.0
    assert MATH_VERIFY.verify("#### 50%", "50").reward == 1.0
    assert MATH_VERIFY.verify("#### 50%", "0.5").reward == 0.0  # a percentage is read as its number
    verdict = MATH_VERIFY.verify("#### 5 5", "10")  # latex2sympy would add these as a mixed number
    assert verdict.reward == 0.0 and "side by side" in verdict.reason
    verdict = MATH_VERIFY.verify("#### 18 or 19", "18")
    assert verdict.reward == 0.0 and "words inside it" in verdict.reason


def near_misses(g: int, k: int, n: int, d: int, letter: str) -> list[tuple[str, bool]]:
    """Answers built from the gold integer ``g``, each with whether it truly equals ``g``."""
    cases = [
        (f"{g}^{{{k}}}", g**k == g),                                   # powers
        (f"{g}^{k}", g**k == g),
        (f"({g})^{{{k}}}", g**k == g),
        (f"{g}\u00b2", g * g == g),
        (f"\\sqrt{{{g}}}", g in (0, 1)),
        (f"{g}{n}", int(f"{g}{n}") == g),                               # a longer number, a decimal, a group
        (f"{g}.{n}", Fraction(f"{g}.{n}") == g),
        (f"{g},{n:03d}", int(f"{g}{n:03d}") == g),
        (f"{g} + {n}", n == 0),                                         # an operator and another operand
        (f"{n} + {g}", n == 0),
        (f"{g} - {n}", n == 0),
        (f"{g} \\times {n}", g * n == g),
        (f"{g} \\cdot {n}", g * n == g),
        (f"{g} * {n}", g * n == g),
        (f"{g}({n})", g * n == g),
        (f"{g} {n}", False),                                            # two numbers side by side
        (f"{g}/{d}", Fraction(g, d) == g),                              # g/d
        (f"\\frac{{{g}}}{{{d}}}", Fraction(g, d) == g),
        (f"{g} \\div {d}", Fraction(g, d) == g),
        (f"{g}{letter}", g == 0),                                       # a variable or a letter glued on
        (f"{g} {letter}", g == 0),
        (f"{g} + {letter}", False),
        (f"{letter} * {g}", g == 0),
        (f"{letter}^{{{g}}}", False),
        (f"{g}\\pi", g == 0),
        (f"{g}e{k}", g == 0),                                           # scientific notation
        (f"{g}E{k}", g == 0),
        (f"{g} thousand", g == 0),                                      # words that scale it
        (f"{g}k", g == 0),
        (f"{g} million", g == 0),
        (f"{g} squared", g in (0, 1)),
        (f"negative {g}", g == 0),
        (f"-{g}", g == 0),
        (f"- {g}", g == 0),
        (f"x \\geq {g}", False),                                        # relations
        (f"x >= {g}", False),
        (f"x \\neq {g}", False),
    ]
    if g <= 30:
        cases.append((f"{g}!", math.factorial(g) == g))
    return cases


WRAPPERS = ["#### {}", "\\boxed{{{}}}", "#### ${}$", "The answer is \\boxed{{{}}}.", "#### The answer is {}."]


@ALL_VERIFIERS
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=st.one_of(st.integers(0, 30), st.integers(0, 10**6)), k=st.integers(2, 6), n=st.integers(0, 999),
       d=st.integers(1, 99), letter=st.sampled_from("xynkmbe"), wrapper=st.sampled_from(WRAPPERS))
def test_fuzzed_near_misses_score_zero_unless_truly_equal(name, g, k, n, d, letter, wrapper):
    verifier = VERIFIERS[name]
    for answer, truly_equal in near_misses(g, k, n, d, letter):
        responses = [wrapper.format(answer)]
        if name == "gsm8k flexible":
            responses.append(f"So the total is {answer}.")  # no marker: the last number
        for response in responses:
            verdict = verifier.verify(response, str(g))
            assert verdict.reward == 0.0 or truly_equal, (response, verdict)
