"""Balanced micro-batch allocation and the padded-tensor-dict splitter (scaffold_areal.microbatch)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scaffold_areal.microbatch import (
    MicroBatchSpec,
    allocate,
    allocate_synced,
    ffd_pack,
    min_micro_batches,
    split_padded_tensor_dict,
    synced_count,
)


def _check_partition(plan, n):
    flat = sorted(i for g in plan.groups for i in g)
    assert flat == list(range(n))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 100), max_size=40), st.integers(100, 400), st.integers(1, 6), st.integers(1, 4),
       st.integers(0, 5))
def test_allocation_is_a_partition_within_budget_with_the_requested_count(lengths, budget, n_mbs, divisor, more):
    spec = MicroBatchSpec(max_tokens_per_mb=budget, n_mbs=n_mbs, n_mbs_divisor=divisor)
    needed = min_micro_batches(lengths, spec)
    assert needed >= n_mbs and needed % divisor == 0
    if needed + more > len(lengths):  # some micro-batch would be empty: refused, naming the minimum
        with pytest.raises(ValueError, match=f"at least {needed + more} sequences are needed"):
            allocate(lengths, spec, count=needed + more)
        return
    plan = allocate(lengths, spec, count=needed + more)
    assert plan.count == needed + more
    _check_partition(plan, len(lengths))
    assert all(t <= budget for t in plan.token_counts)
    assert all(plan.groups), "an empty micro-batch"


def _plans_of_ranks(ranks, spec):
    """What allocate_synced gives each simulated rank: the same exchange (need, held) every rank sees."""
    needs = [(min_micro_batches(lengths, spec), len(lengths)) for lengths in ranks]
    count = synced_count(needs, spec)
    return [allocate(lengths, spec, count=count) for lengths in ranks]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.integers(0, 120), max_size=24), min_size=1, max_size=8), st.integers(1, 300),
       st.integers(1, 4), st.integers(1, 3))
def test_synced_ranks_get_equal_counts_of_nonempty_micro_batches_within_budget(ranks, budget, n_mbs, divisor):
    """Random lengths, ranks and budgets: every sequence placed once, none over budget, equal counts, none empty;
    or, on every rank alike, an error naming the too-long sequence or the minimum sequences per rank."""
    spec = MicroBatchSpec(max_tokens_per_mb=budget, n_mbs=n_mbs, n_mbs_divisor=divisor)
    if any(n > budget for lengths in ranks for n in lengths):
        with pytest.raises(ValueError, match="raise max_tokens_per_mb to at least"):
            _plans_of_ranks(ranks, spec)
        return
    count = max(min_micro_batches(lengths, spec) for lengths in ranks)
    short = [r for r, lengths in enumerate(ranks) if len(lengths) < count]
    if short:
        held = len(ranks[short[0]])
        with pytest.raises(ValueError, match=f"rank {short[0]} holds only {held} sequences.*at least {count} "
                                             r"sequences \(the minimum sequences per rank\)"):
            _plans_of_ranks(ranks, spec)
        return
    plans = _plans_of_ranks(ranks, spec)
    assert {plan.count for plan in plans} == {count}  # the same count on every rank
    for lengths, plan in zip(ranks, plans):
        _check_partition(plan, len(lengths))  # every sequence exactly once
        assert all(plan.groups), "an empty micro-batch"
        assert all(t <= budget for t in plan.token_counts)


def test_no_rank_gets_an_empty_micro_batch_even_with_zero_length_sequences():
    plans = _plans_of_ranks([[0, 0, 0, 0], [60, 60, 60, 60]], MicroBatchSpec(max_tokens_per_mb=60))
    assert [len(p) for p in plans] == [4, 4]
    assert all(len(g) == 1 for p in plans for g in p.groups)


def test_a_rank_with_too_few_sequences_is_a_clear_error_on_every_rank():
    spec = MicroBatchSpec(max_tokens_per_mb=64)
    needs = [(1, 2), (5, 9), (3, 5)]
    with pytest.raises(ValueError) as caught:
        synced_count(needs, spec)
    message = str(caught.value)
    assert "every rank must run 5 micro-batches (rank 1 needs that many" in message
    assert "but rank 0 holds only 2 sequences:" in message and "rank 2" not in message
    assert "at least 5 sequences (the minimum sequences per rank)" in message
    assert synced_count([(1, 5), (5, 9), (3, 5)], spec) == 5


def test_ffd_packs_tightly():
    assert sorted(map(sorted, ffd_pack([7, 5, 3, 3, 2], 10))) == [[0, 2], [1, 3, 4]]
    assert min_micro_batches([7, 5, 3, 3, 2], MicroBatchSpec(10)) == 2


def test_allocation_balances_tokens_across_micro_batches():
    plan = allocate([4] * 9, MicroBatchSpec(max_tokens_per_mb=20), count=3)
    assert plan.token_counts == [12, 12, 12]  # FFD alone would give 20, 16, 0 style fills


def test_more_micro_batches_than_sequences_is_refused_never_empty():
    with pytest.raises(ValueError, match="4 micro-batches for 2 sequences would leave 2 empty.*at least 4 sequences"):
        allocate([5, 6], MicroBatchSpec(100), count=4)
    with pytest.raises(ValueError, match="1 micro-batches for 0 sequences"):
        allocate([], MicroBatchSpec(100))
    plan = allocate([5, 6, 1, 1], MicroBatchSpec(100), count=4)
    assert sorted(len(g) for g in plan.groups) == [1, 1, 1, 1]


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="sequence 1 has 50 tokens.*at least 50"):
        allocate([10, 50], MicroBatchSpec(max_tokens_per_mb=40))
    with pytest.raises(ValueError, match="at least 3 needed"):
        allocate([10, 10, 10], MicroBatchSpec(max_tokens_per_mb=10), count=2)
    with pytest.raises(ValueError, match="n_mbs"):
        MicroBatchSpec(n_mbs=0)


def test_synced_allocation_outside_torch_distributed_is_local():
    plan = allocate_synced([3, 3, 3], MicroBatchSpec(max_tokens_per_mb=6))
    assert plan.count == 2


def _padded(lengths):
    to_padded_tensor_dict = pytest.importorskip("scaffold_areal.padding").to_padded_tensor_dict
    from scaffold_core.trajectory import TrainingSample

    samples = []
    for i, n in enumerate(lengths):
        prompt = 2
        samples.append(TrainingSample(
            input_ids=[100 + i] * n, loss_mask=[0] * prompt + [1] * (n - prompt),
            logprobs=[0.0] * prompt + [-0.5] * (n - prompt), versions=[-1] * prompt + [0] * (n - prompt),
            reward=float(i), advantage=0.0, episode_id=str(i), sample_index=0, group_id=str(i), prompt_len=prompt,
            finish_reason="stop"))
    return to_padded_tensor_dict(samples)


def test_split_padded_tensor_dict_keeps_rows_trims_padding_and_restores_order():
    torch = pytest.importorskip("torch")
    lengths = [9, 3, 7, 4, 8, 2]
    data = _padded(lengths)
    data["meta"] = "kept as is"
    mbs = split_padded_tensor_dict(data, MicroBatchSpec(max_tokens_per_mb=16))
    assert len(mbs) == min_micro_batches(lengths, MicroBatchSpec(16))
    seen = []
    for rows, mb in zip(mbs.groups, mbs):
        assert mb["meta"] == "kept as is"
        assert int(mb["attention_mask"].sum()) <= 16
        assert mb["input_ids"].shape[1] == max(lengths[i] for i in rows)  # padding columns trimmed
        assert mb["rewards"].tolist() == [float(i) for i in rows]
        for k, i in enumerate(rows):
            assert mb["input_ids"][k, : lengths[i]].tolist() == [100 + i] * lengths[i]
        seen += rows
    assert sorted(seen) == list(range(len(lengths)))
    restored = mbs.restore([mb["input_ids"] for mb in mbs])
    assert torch.equal(restored, data["input_ids"])
    assert torch.equal(mbs.restore([mb["rewards"] for mb in mbs]), data["rewards"])


def test_split_needs_an_attention_mask():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="attention_mask"):
        split_padded_tensor_dict({"input_ids": [[1]]}, MicroBatchSpec())
