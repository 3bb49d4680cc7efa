"""The prefill of a batch in the embedded engine, shared by the rows of one group.

Rows of a batch that have the same prompt (the samples of one majority-vote,
best-of-n or GRPO group, which arrive together) need the same prompt KV cache
and the same first next-token logits. With sharing, the forward pass runs over
each distinct prompt once; its cache, attention mask, positions and logits are
then copied out to every row of the group, and each row decodes (and samples
with its own seeded generator) independently from there. Only the batch shape
of the prefill changes, so logprobs stay within float rounding of the unshared
path and greedy outputs are the same.

Torch and transformers are imported by the caller (the engine's worker
thread); this module only receives the objects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Prefill:
    """The state a batch decodes from, one entry per row (rows in the order given)."""

    logits: Any  # [rows, vocab]: each row's next-token logits after its prompt
    attention: Any  # [rows, width]: left-padded attention mask over the prompts
    next_pos: Any  # [rows, 1]: the position of each row's next token
    cache: Any  # transformers DynamicCache holding every row's prompt keys and values
    prompts: int  # distinct prompts pre-filled (the forward pass's batch size)
    shared: int  # of those, prompts that served more than one row
    rows_saved: int  # rows that reused another row's prefill instead of running their own
    seconds: float  # wall time of the prefill, expansion included


def group_prompts(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Distinct prompts in first-seen order, and for each row the index of its prompt among them."""
    index: dict[tuple[int, ...], int] = {}
    distinct: list[list[int]] = []
    of_row: list[int] = []
    for prompt in prompts:
        key = tuple(prompt)
        at = index.get(key)
        if at is None:
            at = index[key] = len(distinct)
            distinct.append(prompt)
        of_row.append(at)
    return distinct, of_row


def prefill(torch: Any, model: Any, prompts: list[list[int]], *, pad_id: int, device: Any, cache_arg: str,
            share: bool = True, reserve: int = 0) -> Prefill:
    """Run the prompts through ``model`` (left padded), once per distinct prompt when ``share``.

    ``reserve``: the most tokens a row will decode after its prompt; the cache keeps room for them so
    decode steps write in place (``kv_cache.py``). 0 gives transformers' growing ``DynamicCache``.
    """
    from transformers import DynamicCache

    from .kv_cache import reserved_cache

    start = time.perf_counter()
    if share:
        distinct, of_row = group_prompts(prompts)
    else:
        distinct, of_row = prompts, list(range(len(prompts)))
    width = max(len(p) for p in distinct)
    input_ids = torch.full((len(distinct), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(distinct), width), dtype=torch.long)
    for i, p in enumerate(distinct):  # left padding: the last column is every row's newest token
        input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        attention[i, width - len(p):] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = reserved_cache(reserve) if reserve > 0 else DynamicCache()
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                   use_cache=True, logits_to_keep=1, **{cache_arg: cache}).logits[:, -1, :]
    next_pos = positions[:, -1:] + 1
    if len(distinct) < len(prompts):  # copy each group's prefill out to its rows
        rows = torch.tensor(of_row, dtype=torch.long, device=device)
        cache.batch_select_indices(rows)
        logits, attention, next_pos = logits[rows], attention[rows], next_pos[rows]
    if logits.is_cuda:  # the kernels run asynchronously: time them, not their launch
        torch.cuda.synchronize(logits.device)
    counts = [0] * len(distinct)
    for at in of_row:
        counts[at] += 1
    return Prefill(logits=logits, attention=attention, next_pos=next_pos, cache=cache, prompts=len(distinct),
                   shared=sum(1 for c in counts if c > 1), rows_saved=len(prompts) - len(distinct),
                   seconds=time.perf_counter() - start)
