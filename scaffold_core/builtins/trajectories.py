"""Built-in trajectory makers: single_turn and grpo.

Which samples become training sequences: **every** sample an episode
produced that has a reward, each with its own reward from the verifier. For
``majority_vote`` and ``best_of_n`` that means all N samples (not just the
voted or best one), so the trainer sees both correct and incorrect attempts;
the episode-level answer only feeds metrics (accuracy, maj@k). A sample
without a reward (not verified, or the verifier could not score it) is
never read as 0.0: ``missing_reward: drop`` (default) leaves it out,
``missing_reward: fail`` fails the episode.
"""

from __future__ import annotations

from typing import Literal

from ..episode import EpisodeResult
from ..plugins.markers import hookimpl
from ..trajectory import (
    TrainingSample,
    TrajectoryMaker,
    check_advantage_options,
    check_missing_reward_policy,
    rollout_normalized,
)


class SingleTurnTrajectoryMaker(TrajectoryMaker):
    """One training sequence per sample that has a reward; advantage = reward (no baseline)."""

    def __init__(self, missing_reward: Literal["drop", "fail"] = "drop"):
        self.missing_reward = check_missing_reward_policy(missing_reward)

    def make(self, episode: EpisodeResult) -> list[TrainingSample]:
        samples, rewards = self.scored(episode)
        return [self.build(episode, s, r, r) for s, r in zip(samples, rewards)]


class GRPOTrajectoryMaker(TrajectoryMaker):
    """The rollouts of one prompt form a group; advantage = (reward - baseline) / (group std + eps).

    A rollout is one sample, or the several samples of one agent run (``Sample.rollout``: a client that
    rewrote its history): the group's statistics count each rollout once, with its one reward, and every
    sample of a rollout gets the rollout's advantage.

    ``baseline``: ``mean`` (GRPO) or ``leave_one_out`` (RLOO). ``std``:
    ``unbiased`` (default, as AReaL), ``population``, or ``none`` (only
    centred: Dr. GRPO, RLOO). Formulas in docs/runtime.md. A group of one
    sample, or of equal rewards, has advantage 0. Samples without a reward are
    handled by ``missing_reward`` before grouping (dropped ones are not in
    the group).
    """

    def __init__(self, std: Literal["unbiased", "population", "none"] = "unbiased", eps: float = 1e-5,
                 baseline: Literal["mean", "leave_one_out"] = "mean",
                 missing_reward: Literal["drop", "fail"] = "drop"):
        check_advantage_options(std, eps, baseline)
        self.std = std
        self.eps = float(eps)
        self.baseline = baseline
        self.missing_reward = check_missing_reward_policy(missing_reward)

    def make(self, episode: EpisodeResult) -> list[TrainingSample]:
        samples, rewards = self.scored(episode)
        advantages = rollout_normalized(samples, rewards, std=self.std, eps=self.eps, baseline=self.baseline)
        return [self.build(episode, s, r, a) for s, r, a in zip(samples, rewards, advantages)]


@hookimpl
def register_trajectory_makers(registry):
    registry.add("single_turn", SingleTurnTrajectoryMaker)
    registry.add("grpo", GRPOTrajectoryMaker)
