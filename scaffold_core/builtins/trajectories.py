"""Built-in trajectory makers: single_turn and grpo.

Which samples become training sequences: **every** sample an episode
produced, each with its own reward from the verifier. For ``majority_vote``
and ``best_of_n`` that means all N samples (not just the voted or best one),
so the trainer sees both correct and incorrect attempts; the episode-level
answer only feeds metrics (accuracy, maj@k).
"""

from __future__ import annotations

from ..episode import EpisodeResult
from ..plugins.markers import hookimpl
from ..trajectory import TrainingSample, TrajectoryMaker, group_normalized


class SingleTurnTrajectoryMaker(TrajectoryMaker):
    """One training sequence per sample; advantage = reward (no baseline)."""

    def make(self, episode: EpisodeResult) -> list[TrainingSample]:
        out = []
        for sample in episode.samples:
            reward = sample.reward or 0.0
            out.append(self.build(episode, sample, reward, reward))
        return out


class GRPOTrajectoryMaker(TrajectoryMaker):
    """The samples of one prompt form a group; advantage = (reward - group mean) / (group std + eps).

    With ``scale: false`` the advantage is only centred (Dr. GRPO). A group of
    one sample has advantage 0.
    """

    def __init__(self, scale: bool = True, eps: float = 1e-6):
        if eps <= 0:
            raise ValueError("eps must be > 0")
        self.scale = scale
        self.eps = eps

    def make(self, episode: EpisodeResult) -> list[TrainingSample]:
        rewards = [s.reward or 0.0 for s in episode.samples]
        advantages = group_normalized(rewards, scale=self.scale, eps=self.eps)
        return [self.build(episode, s, r, a) for s, r, a in zip(episode.samples, rewards, advantages)]


@hookimpl
def register_trajectory_makers(registry):
    registry.add("single_turn", SingleTurnTrajectoryMaker)
    registry.add("grpo", GRPOTrajectoryMaker)
