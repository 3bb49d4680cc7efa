"""Which samples of an episode AReaL trains on.

:class:`ArealSamples` wraps the configured trajectory maker (it gives each
sample its reward, and each token the weight version that sampled it): of
its samples it keeps all, or with ``samples="chosen"`` only the episode's
answer; with ``reject_truncated`` it drops samples cut by
``max_new_tokens``. It runs where the trajectory maker runs, when the
episode ends, so the core's staleness policy (``max_staleness``) sees what
it kept.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from scaffold_core.episode import EpisodeResult
from scaffold_core.train.adapters import chosen_index
from scaffold_core.trajectory import TrainingSample, TrajectoryMaker

SAMPLES = ("all", "chosen")


class ArealSamples(TrajectoryMaker):
    """The trajectory maker ``inner``'s samples, selected (see the module); ``stats`` counts ``dropped_truncated``."""

    def __init__(self, inner: Any, *, samples: str = "all", reject_truncated: bool = False,
                 stats: Counter[str] | None = None):
        if samples not in SAMPLES:
            raise ValueError(f"samples must be one of {SAMPLES}, got {samples!r}")
        self.inner = inner
        self.samples = samples
        self.reject_truncated = reject_truncated
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self.missing_reward = getattr(inner, "missing_reward", "drop")

    def make(self, episode: EpisodeResult) -> list[TrainingSample]:
        trajectories = list(self.inner.make(episode))
        if self.samples == "chosen" and episode.samples:
            index = episode.samples[chosen_index(episode)].sample_index
            trajectories = [t for t in trajectories if t.sample_index == index][:1]
        kept = []
        for t in trajectories:
            if self.reject_truncated and t.finish_reason == "length":
                self.stats["dropped_truncated"] += 1
                continue
            kept.append(t.check())
        return kept
