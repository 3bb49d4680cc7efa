"""Confidence measures, group windows, percentiles and weighted votes: exact values."""

from __future__ import annotations

import math

import pytest

from scaffold_methods.confidence import (
    GroupConfidence,
    group_confidences,
    keep_top,
    percentile,
    token_confidences,
    trace_confidence,
    weighted_vote,
)


def test_top_k_confidence_is_the_negative_mean_of_the_top_logprobs():
    top = [{1: -0.1, 2: -2.0, 3: -3.9}, {4: -1.0, 5: -1.0}]
    values, used = token_confidences([-0.1, -1.0], top, "auto")
    assert used == "top_k"
    assert values == pytest.approx([2.0, 1.0])


def test_sampled_confidence_is_the_sampled_probability_and_the_fallback():
    values, used = token_confidences([math.log(0.5), math.log(0.25), math.nan], None, "auto")
    assert used == "sampled" and values == pytest.approx([0.5, 0.25])  # the NaN token is skipped
    # a position without top logprobs: auto falls back to sampled, top_k refuses with the fix
    values, used = token_confidences([math.log(0.5)], [{}], "auto")
    assert used == "sampled"
    with pytest.raises(ValueError, match="measure: sampled"):
        token_confidences([-0.1], None, "top_k")


def test_group_confidences_slide_over_every_window_and_short_traces_are_one_group():
    assert group_confidences([1, 2, 3, 4, 5], 2) == [1.5, 2.5, 3.5, 4.5]
    assert group_confidences([1, 2], 5) == [1.5]
    groups = GroupConfidence(3)
    assert groups.add([3, 3]) == []  # no full window yet
    assert groups.add([0, 6]) == [2.0, 3.0]  # windows (3,3,0) and (3,0,6)
    assert groups.all_groups() == [2.0, 3.0]


def test_trace_scores():
    conf = [5.0, 5.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 3.0]
    assert trace_confidence(conf, 2, "lowest_group") == 1.0
    assert trace_confidence(conf, 2, "tail") == 4.0
    assert trace_confidence(conf, 2, "mean") == pytest.approx(sum(conf) / len(conf))
    # 11 windows of 2: the lowest 10% is one window (the lowest)
    assert trace_confidence(conf, 2, "bottom_10") == 1.0
    assert math.isnan(trace_confidence([], 2))
    with pytest.raises(ValueError, match="lowest_group"):
        trace_confidence(conf, 2, "median")


def test_percentile_interpolates_like_numpy():
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert percentile([4.0, 1.0], 10) == pytest.approx(1.3)
    assert percentile([2.0], 50) == 2.0
    assert math.isnan(percentile([math.nan], 50))


def test_weighted_vote_counts_weights_and_skips_unkeyed_voters():
    assert weighted_vote(["a", "b", "b"], [3.0, 1.0, 1.5]) == ("a", 3.0, 5.5)
    assert weighted_vote(["a", "b", "b"], [1.0, 1.0, 1.0])[0] == "b"
    assert weighted_vote(["a", "b"], [1.0, 1.0])[0] == "a"  # a tie goes to the key seen first
    assert weighted_vote([None, "b"], [9.0, 1.0]) == ("b", 1.0, 1.0)
    assert weighted_vote([None], [1.0]) == (None, 0.0, 0.0)


def test_keep_top_keeps_the_most_confident_fraction_at_least_one():
    assert keep_top([0.1, 0.9, 0.5, 0.7], 0.5) == [1, 3]
    assert keep_top([0.1, 0.9, 0.5, 0.7], 0.1) == [1]
    assert keep_top([0.5, 0.5, 0.5], 0.34) == [0, 1]  # ceil(1.02) = 2; ties to the earlier trace
    with pytest.raises(ValueError):
        keep_top([1.0], 0.0)
