"""Which samples of an episode AReaL trains on, each token carrying the weight version that sampled it.

:class:`ArealSamples` wraps the configured trajectory maker (it still gives
each sample its reward): of its samples it keeps all, or with
``samples="chosen"`` only the episode's answer; with ``reject_truncated``
it drops samples cut by ``max_new_tokens``; and it replaces each sample's
``versions`` with the per-token versions the :class:`~scaffold_areal.versions.VersionLedger`
recorded, so that a response a weight update interrupted reads ``[5, 5, 6, 6]``.
It runs where the trajectory maker runs, when the episode ends, so the
core's staleness policy (``max_staleness``) already sees those versions.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from scaffold_core.episode import EpisodeResult
from scaffold_core.train.adapters import chosen_index
from scaffold_core.trajectory import TrainingSample, TrajectoryMaker

from .versions import VersionLedger

SAMPLES = ("all", "chosen")


class ArealSamples(TrajectoryMaker):
    """The trajectory maker ``inner``'s samples, selected and given per-token versions (see the module).

    Counts ``dropped_truncated`` and ``versions_unmatched_tokens`` (generated
    tokens no recorded response matched: they keep their sample's version) in ``stats``.
    """

    def __init__(self, inner: Any, ledger: VersionLedger, *, samples: str = "all", reject_truncated: bool = False,
                 stats: Counter[str] | None = None):
        if samples not in SAMPLES:
            raise ValueError(f"samples must be one of {SAMPLES}, got {samples!r}")
        self.inner = inner
        self.ledger = ledger
        self.samples = samples
        self.reject_truncated = reject_truncated
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self.missing_reward = getattr(inner, "missing_reward", "drop")

    def make(self, episode: EpisodeResult) -> list[TrainingSample]:
        versions = self.ledger.pop(episode.episode_id)
        trajectories = list(self.inner.make(episode))
        if self.samples == "chosen" and episode.samples:
            index = episode.samples[chosen_index(episode)].sample_index
            trajectories = [t for t in trajectories if t.sample_index == index][:1]
        kept = []
        for t in trajectories:
            if self.reject_truncated and t.finish_reason == "length":
                self.stats["dropped_truncated"] += 1
                continue
            t.versions, unmatched = versions.versions_for(t.input_ids, t.loss_mask, t.versions)
            if unmatched:
                self.stats["versions_unmatched_tokens"] += unmatched
            kept.append(t.check())
        return kept
