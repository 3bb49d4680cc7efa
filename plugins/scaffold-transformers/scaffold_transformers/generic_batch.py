"""The decode state of a batch on any transformers causal LM, through the model's own forward.

The engine uses it for architectures the lean forward (``lean_llama.py``)
does not implement. The batch is pre-filled left-padded (rows of one group
share a prefill: ``prefill.py``), decodes into transformers' cache (with room
reserved: ``kv_cache.py``), and drops finished rows from the cache at once.
Same interface as :class:`~scaffold_transformers.lean_llama.LeanBatch`.
"""

from __future__ import annotations

from typing import Any

from .lean_llama import PrefillCounts
from .prefill import prefill


class GenericBatch:
    def __init__(self, torch: Any, model: Any, prompts: list[list[int]], *, pad_id: int, cache_arg: str,
                 share: bool, reserve: int):
        self.torch, self.model, self.prompts = torch, model, prompts
        self.device = next(model.parameters()).device
        self.pad_id, self.cache_arg, self.share, self.reserve = pad_id, cache_arg, share, reserve
        self.counts = PrefillCounts()

    def start(self) -> Any:
        pre = prefill(self.torch, self.model, self.prompts, pad_id=self.pad_id, device=self.device,
                      cache_arg=self.cache_arg, share=self.share, reserve=self.reserve)
        c = self.counts
        c.prompts += pre.prompts
        c.shared += pre.shared
        c.rows_saved += pre.rows_saved
        c.seconds += pre.seconds
        self.cache, self.attention, self.next_pos = pre.cache, pre.attention, pre.next_pos
        return pre.logits

    def step(self, tokens: list[int]) -> Any:
        torch = self.torch
        last = torch.tensor([[t] for t in tokens], dtype=torch.long, device=self.device)
        self.attention = torch.cat([self.attention, self.attention.new_ones((len(tokens), 1))], dim=1)
        logits = self.model(input_ids=last, attention_mask=self.attention, position_ids=self.next_pos,
                            use_cache=True, **{self.cache_arg: self.cache}).logits[:, -1, :]
        self.next_pos = self.next_pos + 1
        return logits

    def drop(self, slots: list[int]) -> None:
        gone = set(slots)
        still = [s for s in range(self.attention.shape[0]) if s not in gone]
        if not still:
            return
        keep = self.torch.tensor(still, dtype=self.torch.long, device=self.device)
        self.cache.batch_select_indices(keep)
        self.attention = self.attention[keep]
        self.next_pos = self.next_pos[keep]
