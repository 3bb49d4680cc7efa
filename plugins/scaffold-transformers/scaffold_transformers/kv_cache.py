"""A KV cache that writes each decode step in place.

transformers' ``DynamicCache`` grows by ``torch.cat``: every decode step copies
every layer's whole key and value cache to append one token, so a batch's
decode does quadratic copying in its length (about 8 % of the embedded
engine's decode time on SmolLM2-135M at 64 new tokens). The layers here keep
spare room after the tokens they hold, grown geometrically up to the batch's
known need (prompt width plus its longest ``max_tokens``), and write new
tokens into it; attention reads a view of the filled part. The numbers are the
same: the same keys and values, in the same order, reach the same attention
kernel.

Only the operations the engine performs are supported (forward passes with
``use_cache``, ``batch_select_indices``, ``crop``, ``reset``); the class is
built on first use, so transformers is imported by the engine's worker thread,
never by the core at import time. Where the installed transformers lacks the
cache layer API this relies on, :func:`reserved_cache` returns a plain
``DynamicCache`` and decoding works as before.
"""

from __future__ import annotations

import functools
from typing import Any

#: Room added in one growth step at least (tokens); growth doubles the filled length beyond this.
MIN_GROWTH = 64


class _Reserved:
    """Mixed into transformers' ``DynamicLayer``: buffers with room for ``reserve`` more tokens than they hold."""

    is_initialized: bool  # these three and lazy_initialization come from DynamicLayer
    keys: Any
    values: Any
    lazy_initialization: Any

    def __init__(self, reserve: int = 0) -> None:
        super().__init__()
        self.reserve = reserve
        self._k: Any = None
        self._v: Any = None
        self._n = 0

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self._k is None or self._n + new > self._k.shape[-2]:
            self._grow(key_states, value_states, self._n + new)
        self._k[..., self._n:self._n + new, :].copy_(key_states)
        self._v[..., self._n:self._n + new, :].copy_(value_states)
        self._n += new
        self._expose()
        return self.keys, self.values

    def _grow(self, key_states: Any, value_states: Any, needed: int) -> None:
        spare = min(max(self.reserve, 0), max(MIN_GROWTH, needed))
        self.reserve -= spare  # the batch's need is known: never reserve past it
        capacity = needed + spare
        k = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        v = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if self._n:
            k[..., :self._n, :].copy_(self._k[..., :self._n, :])
            v[..., :self._n, :].copy_(self._v[..., :self._n, :])
        self._k, self._v = k, v

    def _expose(self) -> None:
        self.keys = self._k[..., :self._n, :]
        self.values = self._v[..., :self._n, :]

    def get_seq_length(self) -> int:
        return self._n

    def batch_select_indices(self, indices: Any) -> None:
        if self._n:
            self._k, self._v = self._k[indices], self._v[indices]
            self._expose()

    def reorder_cache(self, beam_idx: Any) -> None:
        if self._n:
            self.batch_select_indices(beam_idx.to(self._k.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._n:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._expose()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the (negative) number of tokens to remove")
        if tokens_to_remove and self._n:
            self._n = max(0, self._n + tokens_to_remove)
            self._expose()

    def reset(self) -> None:
        self._k = self._v = None
        self._n = 0
        super().reset()  # type: ignore[misc]


@functools.cache
def _layer_class() -> type | None:
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None
    return type("ReservedLayer", (_Reserved, DynamicLayer), {})


def reserved_cache(reserve: int) -> Any:
    """An empty cache whose layers keep room for ``reserve`` tokens beyond the prompt (a plain one if unsupported)."""
    from transformers import DynamicCache

    layer = _layer_class()
    cache = DynamicCache()
    if layer is None or not hasattr(cache, "layer_class_to_replicate") or getattr(cache, "layers", None):
        return cache
    cache.layer_class_to_replicate = functools.partial(layer, reserve)  # type: ignore[assignment]  # called with no arguments
    return cache
