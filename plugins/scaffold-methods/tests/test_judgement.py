"""The judge's score parser against well-formed, malformed and hostile judgements."""

from __future__ import annotations

import math
import time

import pytest

from scaffold_methods.judgement import parse_score, yes_probability

WELL_FORMED = [
    ("Score: 7", 0.7), ("score = 7.5", 0.75), ("Rating: 8/10", 0.8), ("**Score:** 6", 0.6),
    ("The response is right.\nThe score is 9", 0.9), ("Grade of 4/5", 0.8), ("[[3]]", 0.3), ("7", 0.7),
    ("  10/10. ", 1.0), ("0", 0.0), ("Score: 7\nFinal score: 7", 0.7), ("SCORE:7", 0.7),
]
MALFORMED = [
    "", "   ", None, "I think it is good.", "Score: eleven", "Score: 11", "Score: -1", "Score: 3 ... Score: 8",
    "[[2]] and then [[9]]", "7 out of 10 maybe 8", "Score: 5/0", "Score: nan", "Score: inf", "1e999",
    "\x00\x01", "9" * 5000, "Score: " + "9" * 40, "The answer is 7, score pending.",
]


@pytest.mark.parametrize("text, expected", WELL_FORMED)
def test_well_formed_scores(text, expected):
    value, reason = parse_score(text, 0, 10)
    assert value == pytest.approx(expected), reason


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_judgements_are_unscored_never_zero(text):
    value, reason = parse_score(text, 0, 10)
    assert value is None and reason


def test_other_scales():
    assert parse_score("Score: 3", 1, 5)[0] == pytest.approx(0.5)
    assert parse_score("Score: 0", 1, 5)[0] is None  # below the scale
    with pytest.raises(ValueError):
        parse_score("Score: 3", 5, 5)


def test_hostile_inputs_are_bounded_in_time():
    for text in ("Score: " * 200_000, "(" * 1_000_000, "score is " + " " * 500_000 + "7", "[[" * 300_000):
        started = time.perf_counter()
        value, _ = parse_score(text, 0, 10)
        assert time.perf_counter() - started < 2.0
        assert value is None or 0 <= value <= 1


def test_yes_probability_from_top_logprobs_and_the_sampled_fallback():
    top = {"Yes": math.log(0.6), " yes": math.log(0.1), "No": math.log(0.1), "Maybe": math.log(0.2)}
    p, _ = yes_probability(top, None)
    assert p == pytest.approx(0.7 / 0.8)
    assert yes_probability(None, ("No", math.log(0.9)))[0] == pytest.approx(0.1)
    assert yes_probability(None, (" Yes.", math.log(0.8)))[0] == pytest.approx(0.8)
    assert yes_probability({"Maybe": -0.1}, ("Maybe", -0.1))[0] is None
    assert yes_probability({}, None)[0] is None
