"""Keys and values of finished sequences, reused by prompts that extend them.

The next turn of a conversation, the next step of a tool loop, a follow-up
question: each sends a prompt that begins with the previous request's prompt
and its output. With the keys and values the engine computed for that
sequence kept, only the new tokens are pre-filled. Keys and values depend only
on the tokens before them (causal attention), so a stored prefix is valid for
any prompt that starts with it, under the same weights: entries are tagged
with the weight version that computed them and a weight update empties the
store.

Entries are kept most-recently-used first within a memory budget
(``prefix_cache_mb``); an entry that a newer, longer one extends is dropped.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Any

#: A stored prefix is reused only when it covers at least this many prompt tokens.
MIN_REUSE = 16


@dataclass(eq=False)
class Entry:
    tokens: tuple[int, ...]
    version: int
    keys: list[Any]  # per layer [1, kv_heads, length, head_dim]
    values: list[Any]
    nbytes: int

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Hit:
    """A stored sequence's keys and values, of which the first ``length`` tokens begin a prompt."""

    keys: list[Any]
    values: list[Any]
    length: int


class PrefixStore:
    """Keys and values of recent sequences, looked up by the longest prefix they share with a prompt."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()  # id -> entry, LRU last
        self.nbytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def add(self, tokens: list[int], version: int, keys: list[Any], values: list[Any]) -> None:
        """Keep a sequence's keys and values (copied: the batch's cache is reused)."""
        if self.budget <= 0 or len(tokens) < MIN_REUSE:
            return
        nbytes = sum(k.numel() * k.element_size() for k in keys) * 2
        if nbytes > self.budget:
            return
        key = tuple(tokens)
        for at, old in list(self.entries.items()):  # what the new sequence extends is no longer needed
            if old.version != version or (old.length <= len(key) and key[:old.length] == old.tokens):
                self._remove(at)
        entry = Entry(key, version, [k.clone() for k in keys], [v.clone() for v in values], nbytes)
        self.entries[id(entry)] = entry
        self.nbytes += nbytes
        while self.nbytes > self.budget and self.entries:
            self._remove(next(iter(self.entries)))

    def longest_prefix(self, prompt: list[int], version: int) -> Hit | None:
        """The stored keys and values covering the longest start of ``prompt`` (at least one token left over)."""
        best: Entry | None = None
        best_len = MIN_REUSE - 1
        wanted = tuple(prompt)
        for entry in self.entries.values():
            if entry.version != version:
                continue
            n = len(os.path.commonprefix([entry.tokens, wanted]))
            n = min(n, len(prompt) - 1)  # the last prompt token is always computed: its logits start decoding
            if n > best_len:
                best, best_len = entry, n
        if best is None:
            return None
        self.entries.move_to_end(id(best))
        self.hits += 1
        self.reused_tokens += best_len
        return Hit(best.keys, best.values, best_len)

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0

    def _remove(self, at: int) -> None:
        entry = self.entries.pop(at)
        self.nbytes -= entry.nbytes
