"""The weight version of every generated token, even when one response spans several versions.

AReaL's ``agenerate`` reports a version per output token: a response that a
weight update interrupted is resumed on the new weights, so its tokens can
read ``[5, 5, 5, 6, 6]``. scaffold's samples carry one version per engine
result, so the engine adapter records every response here (keyed by
episode), and :meth:`EpisodeVersions.versions_for` gives each token of a
finished training sample the version that sampled it: each run of generated
tokens is matched, by its exact token ids and the exact ids before it, to
the response(s) that produced it. This works for any controller that keeps
the sampled ids (which scaffold's token rules require).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Response:
    output_ids: list[int]
    versions: list[int]
    used: bool = False


@dataclass
class EpisodeVersions:
    """The responses one episode received, indexed by the exact prompt ids each was generated for."""

    by_prompt: dict[tuple[int, ...], list[_Response]] = field(default_factory=dict)

    def add(self, prompt_ids: Sequence[int], output_ids: Sequence[int], versions: Sequence[int]) -> None:
        self.by_prompt.setdefault(tuple(prompt_ids), []).append(_Response(list(output_ids), list(versions)))

    def _match(self, seq: Sequence[int], pos: int, end: int) -> _Response | None:
        candidates = self.by_prompt.get(tuple(seq[:pos]))
        if not candidates:
            return None
        best = None
        for response in candidates:
            n = min(len(response.output_ids), end - pos)
            if n and response.output_ids[:n] == list(seq[pos:pos + n]):
                if not response.used:
                    return response
                best = best or response
        return best

    def versions_for(self, input_ids: Sequence[int], loss_mask: Sequence[int],
                     fallback: Sequence[int]) -> tuple[list[int], int]:
        """(per-token versions, how many generated tokens matched no recorded response).

        Positions with loss mask 0 get -1. Generated tokens that match no
        recorded response keep ``fallback`` (the sample's own version).
        """
        out = [-1 if not m else int(v) for m, v in zip(loss_mask, fallback)]
        unmatched = 0
        n = len(input_ids)
        pos = 0
        while pos < n:
            if not loss_mask[pos]:
                pos += 1
                continue
            end = pos
            while end < n and loss_mask[end]:
                end += 1
            while pos < end:
                response = self._match(input_ids, pos, end)
                if response is None:
                    unmatched += end - pos
                    pos = end
                    break
                response.used = True
                take = min(len(response.output_ids), end - pos)
                out[pos:pos + take] = response.versions[:take]
                pos += take
        return out, unmatched


class VersionLedger:
    """Responses per episode id, recorded by the engine adapter and popped once the episode is done."""

    def __init__(self) -> None:
        self._episodes: dict[str, EpisodeVersions] = {}
        self._lock = threading.Lock()

    def record(self, episode_id: str, prompt_ids: Sequence[int], output_ids: Sequence[int],
               versions: Sequence[int]) -> None:
        with self._lock:
            self._episodes.setdefault(episode_id, EpisodeVersions()).add(prompt_ids, output_ids, versions)

    def pop(self, episode_id: str) -> EpisodeVersions:
        """The episode's responses (empty when it made none), forgotten here."""
        with self._lock:
            return self._episodes.pop(episode_id, None) or EpisodeVersions()

    def __len__(self) -> int:
        return len(self._episodes)
