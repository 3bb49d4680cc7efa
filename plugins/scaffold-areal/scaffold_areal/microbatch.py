"""Balanced micro-batches for trainers: first-fit decreasing under a token budget, synced across ranks.

A trainer consuming scaffold's output (``to_padded_tensor_dict``) splits each
rank's batch into micro-batches that fit a token budget. Under data
parallelism every rank must run the **same number** of micro-batches, or the
gradient collectives of the extra ones wait forever. So:

1. each rank computes the fewest micro-batches its sequences need
   (first-fit decreasing, at least ``n_mbs``, a multiple of
   ``n_mbs_divisor``);
2. the ranks exchange (that count, how many sequences they hold) with one
   ``all_gather`` on the Gloo CPU group (never an NCCL WORLD group; see
   :mod:`scaffold_core.distributed`) and agree on the largest count;
3. each rank then fills exactly that many micro-batches, balancing tokens
   (largest sequence first into the lightest micro-batch that has room).

**No micro-batch is ever empty**: a forward/backward on an empty batch hangs a
collective or produces NaN. Every micro-batch holds at least one sequence;
when some rank holds fewer sequences than the count every rank must run,
every rank raises the same :class:`ValueError`, naming that rank and the
minimum sequences per rank (rebalance the data, or raise the budget). torch
is needed only by :func:`split_padded_tensor_dict`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MicroBatchSpec:
    """How to cut a batch: a token budget per micro-batch and constraints on the count.

    ``max_tokens_per_mb``: the most tokens (sum of sequence lengths) in one
    micro-batch; ``None`` for no budget. ``n_mbs``: at least this many
    micro-batches. ``n_mbs_divisor``: the count is a multiple of this (e.g.
    pipeline stages).
    """

    max_tokens_per_mb: int | None = None
    n_mbs: int = 1
    n_mbs_divisor: int = 1

    def __post_init__(self) -> None:
        if self.max_tokens_per_mb is not None and self.max_tokens_per_mb < 1:
            raise ValueError(f"max_tokens_per_mb must be >= 1 or None, got {self.max_tokens_per_mb}")
        if self.n_mbs < 1:
            raise ValueError(f"n_mbs must be >= 1, got {self.n_mbs}")
        if self.n_mbs_divisor < 1:
            raise ValueError(f"n_mbs_divisor must be >= 1, got {self.n_mbs_divisor}")

    @property
    def capacity(self) -> float:
        return math.inf if self.max_tokens_per_mb is None else self.max_tokens_per_mb


@dataclass
class MicroBatchPlan:
    """Which sequences (indices into the batch) go into each micro-batch."""

    groups: list[list[int]]
    lengths: list[int]

    @property
    def count(self) -> int:
        return len(self.groups)

    @property
    def token_counts(self) -> list[int]:
        return [sum(self.lengths[i] for i in g) for g in self.groups]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.groups)

    def __len__(self) -> int:
        return len(self.groups)


def _check_lengths(lengths: Sequence[int], spec: MicroBatchSpec) -> list[int]:
    out = []
    for i, n in enumerate(lengths):
        n = int(n)
        if n < 0:
            raise ValueError(f"sequence {i} has a negative length ({n})")
        if n > spec.capacity:
            raise ValueError(f"sequence {i} has {n} tokens, more than max_tokens_per_mb={spec.max_tokens_per_mb}; "
                             f"raise max_tokens_per_mb to at least {n}")
        out.append(n)
    return out


def _decreasing(lengths: list[int]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def ffd_pack(lengths: Sequence[int], capacity: float) -> list[list[int]]:
    """First-fit decreasing: the fewest bins (approximately) of ``capacity`` tokens holding every sequence."""
    bins: list[list[int]] = []
    sums: list[int] = []
    for i in _decreasing(list(lengths)):
        for b, total in enumerate(sums):
            if total + lengths[i] <= capacity:
                bins[b].append(i)
                sums[b] += lengths[i]
                break
        else:
            bins.append([i])
            sums.append(lengths[i])
    return bins


def min_micro_batches(lengths: Sequence[int], spec: MicroBatchSpec) -> int:
    """The fewest micro-batches this rank needs under ``spec`` (FFD count, >= n_mbs, a multiple of the divisor)."""
    checked = _check_lengths(lengths, spec)
    count = max(len(ffd_pack(checked, spec.capacity)), spec.n_mbs)
    return -(-count // spec.n_mbs_divisor) * spec.n_mbs_divisor


def allocate(lengths: Sequence[int], spec: MicroBatchSpec, *, count: int | None = None) -> MicroBatchPlan:
    """Exactly ``count`` micro-batches (default: the fewest possible), balanced by tokens, none empty.

    Raises :class:`ValueError` when ``count`` is too small to hold the
    sequences under the budget, or larger than the number of sequences (some
    micro-batch would be empty).
    """
    checked = _check_lengths(lengths, spec)
    needed = min_micro_batches(checked, spec)
    count = needed if count is None else int(count)
    if count < needed:
        raise ValueError(f"{count} micro-batches cannot hold these sequences under {spec}; at least {needed} needed")
    if count > len(checked):
        raise ValueError(
            f"{count} micro-batches for {len(checked)} sequences would leave {count - len(checked)} empty, and an "
            f"empty micro-batch hangs collectives or gives NaN: at least {count} sequences are needed (the minimum "
            f"sequences per rank under {spec}); give this rank more sequences or lower n_mbs / n_mbs_divisor")
    groups = _balanced(checked, count, spec.capacity) or _split_to(ffd_pack(checked, spec.capacity), checked, count)
    return MicroBatchPlan([sorted(g) for g in groups], checked)


def _balanced(lengths: list[int], count: int, capacity: float) -> list[list[int]] | None:
    """Largest first into the lightest micro-batch with room (the emptier on ties); None if one finds no room.

    With at least ``count`` sequences every micro-batch gets one: an empty
    micro-batch is always among the lightest and always has room.
    """
    groups: list[list[int]] = [[] for _ in range(count)]
    sums = [0] * count
    for i in _decreasing(lengths):
        best = None
        for b in range(count):
            if sums[b] + lengths[i] <= capacity and (
                    best is None or (sums[b], len(groups[b])) < (sums[best], len(groups[best]))):
                best = b
        if best is None:
            return None
        groups[best].append(i)
        sums[best] += lengths[i]
    return groups


def _split_to(groups: list[list[int]], lengths: list[int], count: int) -> list[list[int]]:
    """Grow an FFD packing to ``count`` micro-batches by moving single sequences out (always fits).

    Needs at least ``count`` sequences, so some micro-batch always has two to split.
    """
    groups = [list(g) for g in groups]
    while len(groups) < count:
        splittable = [g for g in groups if len(g) > 1]
        if not splittable:
            raise RuntimeError(f"cannot make {count} non-empty micro-batches of {len(lengths)} sequences")
        heaviest = max(splittable, key=lambda g: sum(lengths[i] for i in g))
        smallest = min(heaviest, key=lambda i: (lengths[i], i))
        heaviest.remove(smallest)
        groups.append([smallest])
    return groups


def synced_count(needs: Sequence[tuple[int, int]], spec: MicroBatchSpec | None = None) -> int:
    """The micro-batch count every rank runs, from each rank's (fewest micro-batches it needs, sequences it holds).

    The largest need, so every rank's sequences fit. Raises :class:`ValueError`
    (the same on every rank, which all see the same ``needs``) when some rank
    holds fewer sequences than that count: it would get an empty micro-batch.
    """
    if not needs:
        raise ValueError("no ranks")
    count = max(need for need, _ in needs)
    short = [(rank, held) for rank, (_, held) in enumerate(needs) if held < count]
    if short:
        ranks = ", ".join(f"rank {rank} holds only {held} sequences" for rank, held in short[:8])
        more = f" (and {len(short) - 8} more ranks)" if len(short) > 8 else ""
        worst = max(range(len(needs)), key=lambda r: (needs[r][0], -r))
        raise ValueError(
            f"every rank must run {count} micro-batches (rank {worst} needs that many"
            f"{f' under {spec}' if spec is not None else ''}), and no micro-batch may be empty, but {ranks}{more}: "
            f"give every rank at least {count} sequences (the minimum sequences per rank), or raise "
            "max_tokens_per_mb / lower n_mbs so that fewer micro-batches are needed")
    return count


def allocate_synced(lengths: Sequence[int], spec: MicroBatchSpec, group: Any = None) -> MicroBatchPlan:
    """:func:`allocate` with the micro-batch count made equal across the ranks of ``group``, none empty.

    One ``all_gather`` of (local minimum count, local sequence count) on the
    Gloo CPU group (``group=None``: the one
    :func:`scaffold_core.distributed.init_process_group` made; a non-Gloo WORLD
    group is refused), bounded by the group's timeout; then
    :func:`synced_count` on every rank, so all ranks agree or all raise.
    Outside torch.distributed this is plain :func:`allocate` (with the same
    checks).
    """
    from scaffold_core.distributed import all_gather_objects

    local = (min_micro_batches(lengths, spec), len(lengths))
    needs = [(int(need), int(held)) for need, held in all_gather_objects(local, group)]
    return allocate(lengths, spec, count=synced_count(needs, spec))


@dataclass
class MicroBatches:
    """Micro-batches of a padded tensor dict, plus what is needed to put outputs back in batch order."""

    mbs: list[dict[str, Any]]
    groups: list[list[int]]
    batch_size: int
    token_counts: list[int] = field(default_factory=list)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.mbs)

    def __len__(self) -> int:
        return len(self.mbs)

    def restore(self, outputs: Sequence[Any], pad_value: float = 0) -> Any:
        """Concatenate per-micro-batch outputs (first dim = micro-batch rows) back into batch order.

        Outputs whose second dimension differs (trimmed padding) are right-padded with ``pad_value``.
        """
        import torch

        if len(outputs) != len(self.groups):
            raise ValueError(f"got {len(outputs)} outputs for {len(self.groups)} micro-batches")
        parts = [o for o, g in zip(outputs, self.groups) if g]
        if not parts:
            raise ValueError("no micro-batch has rows")
        if parts[0].dim() >= 2:
            width = max(p.shape[1] for p in parts)
            parts = [torch.nn.functional.pad(p, (0, 0) * (p.dim() - 2) + (0, width - p.shape[1]), value=pad_value)
                     if p.shape[1] < width else p for p in parts]
        cat = torch.cat(parts, dim=0)
        order = torch.tensor([i for g in self.groups for i in g], dtype=torch.long)
        out = torch.empty_like(cat)
        out[order] = cat
        return out


def split_padded_tensor_dict(data: dict[str, Any], spec: MicroBatchSpec, *, group: Any = None,
                             synced: bool = True, trim: bool = True) -> MicroBatches:
    """Split a padded tensor dict (``to_padded_tensor_dict`` output) into balanced micro-batches.

    Sequence lengths come from ``attention_mask`` [B, L]. Every tensor whose
    first dimension is B is split by rows; with ``trim`` the [B, L] ones are
    also cut to the micro-batch's longest sequence (padding columns only).
    Anything else is passed to every micro-batch unchanged. With ``synced``
    (default) the count is made equal across data-parallel ranks over the
    Gloo ``group`` (see :func:`allocate_synced`).
    """
    import torch

    mask = data.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("split_padded_tensor_dict needs data['attention_mask'] as a [batch, seq_len] tensor "
                         "(to_padded_tensor_dict provides it)")
    batch, seq_len = mask.shape
    lengths = [int(n) for n in mask.to(torch.int64).sum(dim=1).tolist()]
    plan = allocate_synced(lengths, spec, group) if synced else allocate(lengths, spec)
    mbs = []
    for rows in plan.groups:
        index = torch.tensor(rows, dtype=torch.long)
        sub_mask = mask.index_select(0, index)
        width = seq_len
        if trim:
            used = sub_mask.any(dim=0).nonzero()
            width = int(used.max()) + 1 if used.numel() else 0
        mb: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == batch:
                value = value.index_select(0, index)
                if trim and value.dim() >= 2 and value.shape[1] == seq_len:
                    value = value[:, :width]
            mb[key] = value
        mbs.append(mb)
    return MicroBatches(mbs, plan.groups, batch, plan.token_counts)
