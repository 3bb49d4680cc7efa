"""pass@k, pass^k, majority@k and best-of-N@k: hand-computed values, the standard estimator, and brute force
over every k-subset on random data."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaffold_report.eval.answers import Answer, Problem, Problems, answers_of
from scaffold_report.eval.estimators import best_of_n_at_k, majority_at_k, pass_at_k, pass_hat_k, vote_groups
from scaffold_report.eval.figures import Bootstrap, eval_figures, parse_ks


def chen_pass_at_k(n: int, c: int, k: int) -> float:
    """The numerically stable estimator of Chen et al. (2021) as published with HumanEval."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def brute(values: list[float], k: int, pick) -> float:
    """The mean of ``pick(chosen indices)`` over every k-subset."""
    subsets = list(itertools.combinations(range(len(values)), k))
    return sum(pick(s) for s in subsets) / len(subsets)


def brute_majority(keys: list[str | None], values: list[float], k: int) -> float:
    worth: dict[str, list[float]] = {}
    for key, value in zip(keys, values):
        if key is not None:
            worth.setdefault(key, []).append(value)

    def vote(subset):
        counts: dict[str, int] = {}
        for i in subset:
            if keys[i] is not None:
                counts[keys[i]] = counts.get(keys[i], 0) + 1
        if not counts:
            return 0.0
        top = max(counts.values())
        tied = [key for key, count in counts.items() if count == top]
        return sum(sum(worth[key]) / len(worth[key]) for key in tied) / len(tied)

    return brute(values, k, vote)


def brute_best(scores: list[float | None], values: list[float], k: int) -> float:
    def best(subset):
        ranked = [-math.inf if scores[i] is None else scores[i] for i in subset]
        top = max(ranked)
        tied = [i for i, r in zip(subset, ranked) if r == top]
        return sum(values[i] for i in tied) / len(tied)

    return brute(values, k, best)


# -- hand-computed values ------------------------------------------------------------------------------------


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 3 of the 6 pairs hold the right answer
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 8, 3) == 1.0  # fewer than 3 wrong answers: every triple holds a right one


def test_pass_hat_k_by_hand():
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)  # one of the six pairs is both right
    assert pass_hat_k(4, 4, 3) == 1.0 and pass_hat_k(4, 2, 3) == 0.0
    assert pass_hat_k(5, 3, 1) == pytest.approx(0.6)


def test_majority_at_k_by_hand():
    # answers a, a, b with a right: a pair wins with "a" for (a, a) and ties 1-1 for the two (a, b) pairs
    groups, no_key = vote_groups(["a", "a", "b"], [1.0, 1.0, 0.0])
    assert majority_at_k(groups, no_key, 1) == pytest.approx(2 / 3)
    assert majority_at_k(groups, no_key, 2) == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert majority_at_k(groups, no_key, 3) == 1.0
    # a 2-2 tie between the right and a wrong key earns half
    groups, no_key = vote_groups(["a", "a", "b", "b"], [1.0, 1.0, 0.0, 0.0])
    assert majority_at_k(groups, no_key, 4) == 0.5
    # answers without a key cast no vote: k answers with no vote earn 0
    groups, no_key = vote_groups([None, None, "a"], [0.0, 0.0, 1.0])
    assert majority_at_k(groups, no_key, 1) == pytest.approx(1 / 3)
    assert majority_at_k(groups, no_key, 2) == pytest.approx(2 / 3)  # the pair with "a" votes "a"; (None, None) 0


def test_best_of_n_at_k_by_hand():
    # scores 0.9 (wrong), 0.5 (right), 0.1 (right): the top of a pair is right unless it holds the 0.9 answer
    assert best_of_n_at_k([0.9, 0.5, 0.1], [0.0, 1.0, 1.0], 2) == pytest.approx(1 / 3)
    assert best_of_n_at_k([0.9, 0.5, 0.1], [0.0, 1.0, 1.0], 1) == pytest.approx(2 / 3)
    # equal scores share: a tie of one right and one wrong answer earns half
    assert best_of_n_at_k([1.0, 1.0], [1.0, 0.0], 2) == 0.5
    # an answer the scorer could not score ranks below every scored one
    assert best_of_n_at_k([None, 0.0], [1.0, 0.0], 2) == 0.0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_hat_k(3, 4, 1)
    with pytest.raises(ValueError, match="k <= n"):
        majority_at_k([(2, 1.0)], 0, 0)


# -- against the standard estimator and brute force ---------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_standard_estimator(args):
    n, c, k = args
    assert pass_at_k(n, c, k) == pytest.approx(chen_pass_at_k(n, c, k), abs=1e-12)


answer_sets = st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from([None, "a", "b", "c", "d"]), min_size=n, max_size=n),
    st.sets(st.sampled_from(["a", "b", "c", "d"]), max_size=2),
    st.integers(1, n)))


@settings(max_examples=300, deadline=None)
@given(answer_sets)
def test_every_estimator_is_the_mean_over_all_k_subsets(data):
    keys, right, k = data
    values = [1.0 if key in right else 0.0 for key in keys]
    n, c = len(values), int(sum(values))
    assert pass_at_k(n, c, k) == pytest.approx(brute(values, k, lambda s: max(values[i] for i in s)))
    assert pass_hat_k(n, c, k) == pytest.approx(brute(values, k, lambda s: min(values[i] for i in s)))
    groups, no_key = vote_groups(keys, values)
    assert majority_at_k(groups, no_key, k) == pytest.approx(brute_majority(keys, values, k))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.lists(st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 1.0])), min_size=n, max_size=n),
    st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n), st.integers(1, n))))
def test_best_of_n_is_the_mean_over_all_k_subsets(data):
    scores, values, k = data
    assert best_of_n_at_k(scores, values, k) == pytest.approx(brute_best(scores, values, k))


def test_majority_with_many_distinct_answers_is_exact_and_fast():
    keys = [str(i % 13) for i in range(16)]
    values = [1.0 if key == "3" else 0.0 for key in keys]
    groups, no_key = vote_groups(keys, values)
    for k in (2, 4, 8):  # C(16, 8) = 12,870 subsets by brute force, one dynamic programme here
        assert majority_at_k(groups, no_key, k) == pytest.approx(brute_majority(keys, values, k))


# -- figures over problems -----------------------------------------------------------------------------------


def problem(i: int, rewards: list[float], keys: list[str | None] | None = None, tokens: int = 10) -> Problem:
    keys = keys or [str(r) for r in rewards]
    return Problem(f"p{i}", i, "1", [Answer(key, r, tokens, b) for b, (key, r) in enumerate(zip(keys, rewards))])


def test_figures_average_over_problems_with_enough_answers():
    problems = Problems([problem(0, [1.0, 0.0, 0.0, 0.0]), problem(1, [1.0, 1.0, 1.0, 1.0]),
                         problem(2, [0.0, 0.0], tokens=30)], failed=1)
    for p in problems.problems:
        for a in p.answers:
            a.score = a.reward
    figures = eval_figures(problems, [1, 4], bootstrap=Bootstrap(resamples=200))
    one, four = figures["by_k"]
    assert one["problems"] == 3 and four["problems"] == 2  # problem 2 has two answers, too few for k=4
    assert one["pass@k"]["value"] == pytest.approx((0.25 + 1.0 + 0.0) / 3)
    assert four["pass@k"]["value"] == 1.0 and four["pass^k"]["value"] == 0.5
    assert one["tokens_per_problem"]["value"] == pytest.approx((10 + 10 + 30) / 3)
    assert four["tokens_per_problem"]["value"] == 40
    assert figures["problems"] == {"total": 4, "evaluated": 3, "failed": 1, "without_answers": 0}
    low, high = one["pass@k"]["ci"]
    assert 0.0 <= low <= one["pass@k"]["value"] <= high <= 1.0


def test_bootstrap_intervals_are_seeded_and_shrink_with_more_problems():
    few = [1.0, 0.0] * 10
    many = [1.0, 0.0] * 1000
    assert Bootstrap(seed=3).interval(few) == Bootstrap(seed=3).interval(few)
    low_few, high_few = Bootstrap().interval(few)
    low_many, high_many = Bootstrap().interval(many)
    assert high_many - low_many < (high_few - low_few) / 5
    assert Bootstrap().interval([0.5] * 30) == [0.5, 0.5]
    assert Bootstrap(resamples=0).interval(few) is None


def test_answers_of_reads_repeat_branches_and_plain_samples():
    head = {"samples": [
        {"sample_index": 0, "reward": 0.0, "generated_tokens": 5,
         "metadata": {"branch": 0, "branch_answer": {"sample": None, "key": "7", "reward": 1.0, "logprob": -0.5}}},
        {"sample_index": 1, "reward": 1.0, "key": "7", "generated_tokens": 6, "metadata": {"branch": 0}},
        {"sample_index": 2, "reward": None, "generated_tokens": 4,
         "metadata": {"branch": 1, "branch_answer": {"sample": 2, "key": None, "reward": None}}},
    ]}
    first, second = answers_of(head)
    assert (first.key, first.reward, first.tokens, first.logprob) == ("7", 1.0, 11, -0.5)
    assert (second.reward, second.tokens) == (None, 4)
    plain = answers_of({"samples": [{"sample_index": 0, "reward": 1.0, "extracted": "3", "generated_tokens": 2}]})
    assert [(a.key, a.reward, a.tokens) for a in plain] == [("3", 1.0, 2)]


@pytest.mark.parametrize("text, expected", [("1,2,4", [1, 2, 4]), ("8, 1,1", [1, 8]), ([16, 4], [4, 16])])
def test_parse_ks(text, expected):
    assert parse_ks(text) == expected


@pytest.mark.parametrize("text", ["0,2", "a", "", "1,,x"])
def test_parse_ks_refuses_bad_lists(text):
    with pytest.raises(ValueError, match="--k"):
        parse_ks(text)
