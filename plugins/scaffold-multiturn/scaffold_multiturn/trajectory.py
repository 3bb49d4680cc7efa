"""The ``multiturn`` trajectory maker: one training sequence per conversation, with its turns exposed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.trajectory import (
    TrainingSample,
    TrajectoryMaker,
    check_advantage_options,
    check_missing_reward_policy,
    rollout_normalized,
)


@dataclass(slots=True)
class MultiTurnTrainingSample(TrainingSample):
    """A :class:`~scaffold_core.TrainingSample` plus where each model turn sits and what it earned.

    ``turn_starts``/``turn_ends``: for each model turn, the half-open range
    of its tokens in ``input_ids``. ``turn_rewards``: each turn's reward
    (from the environment; see the plugin README). ``reward`` is the
    episode's (discounted) reward.
    """

    turn_starts: list[int] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_spans(sample: Sample) -> list[tuple[int, int]]:
    """(start, end) in ``input_ids`` of each run of model-generated tokens (output mask 1)."""
    spans = []
    offset = len(sample.prompt_ids)
    start = None
    for i, m in enumerate(sample.output_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((offset + start, offset + i))
            start = None
    if start is not None:
        spans.append((offset + start, offset + len(sample.output_mask)))
    return spans


class MultiTurnTrajectoryMaker(TrajectoryMaker):
    """One training sequence per conversation: model turns trained, environment turns masked out.

    ``advantage: reward`` (default) uses the episode's reward as the
    advantage; ``advantage: grpo`` normalises rewards over the episode's
    rollouts (``controller.samples > 1``; the conversations of one agent run
    are one rollout and share its advantage) exactly like the ``grpo`` maker,
    with the same ``std``, ``eps`` and ``baseline`` options (ignored
    with ``advantage: reward``). A conversation without a reward is handled by
    ``missing_reward`` (``drop``: left out; ``fail``: fails the episode),
    never scored 0. Each generated token carries the weight version that
    sampled it (the sample's per-token ``versions``).
    """

    def __init__(self, advantage: Literal["reward", "grpo"] = "reward",
                 std: Literal["unbiased", "population", "none"] = "unbiased", eps: float = 1e-5,
                 baseline: Literal["mean", "leave_one_out"] = "mean",
                 missing_reward: Literal["drop", "fail"] = "drop"):
        if advantage not in ("reward", "grpo"):
            raise ValueError(f"advantage must be 'reward' or 'grpo', got {advantage!r}")
        check_advantage_options(std, eps, baseline)
        self.advantage = advantage
        self.std = std
        self.eps = float(eps)
        self.baseline = baseline
        self.missing_reward = check_missing_reward_policy(missing_reward)

    def make(self, episode: EpisodeResult) -> list[TrainingSample]:
        samples, rewards = self.scored(episode)
        if self.advantage == "grpo":
            advantages = rollout_normalized(samples, rewards, std=self.std, eps=self.eps, baseline=self.baseline)
        else:
            advantages = list(rewards)
        return [self._one(episode, s, r, a) for s, r, a in zip(samples, rewards, advantages)]

    def _one(self, episode: EpisodeResult, sample: Sample, reward: float, advantage: float) -> MultiTurnTrainingSample:
        base = self.build(episode, sample, reward, advantage)
        spans = model_spans(sample)
        if sample.turn_rewards is not None and len(sample.turn_rewards) == len(spans):
            turn_rewards = [float(r) for r in sample.turn_rewards]
        else:  # no per-turn rewards recorded: the episode's reward on its last turn
            turn_rewards = [0.0] * len(spans)
            if spans:
                turn_rewards[-1] = float(reward)
        fields = {name: getattr(base, name) for name in TrainingSample.__dataclass_fields__}
        return MultiTurnTrainingSample(**fields, turn_starts=[s for s, _ in spans], turn_ends=[e for _, e in spans],
                                       turn_rewards=turn_rewards).check()
