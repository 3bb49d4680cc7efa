"""Training samples: the trajectory-maker contract and the token rules every sample follows.

Token faithfulness: a training sample is ``prompt_ids + output_ids`` exactly
as the engine saw and sampled them (never re-tokenized text). Prompt tokens
and environment tokens get loss mask 0, logprob 0.0 and version -1; tokens
the model generated get loss mask 1, the engine's behaviour logprob, and the
weight version that sampled it (the sample's per-token ``versions`` when it
has them, else its ``weight_version``; 0 when the engine reports none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

from .episode import EpisodeResult, Sample
from .generation import version_number

_S = TypeVar("_S", bound="TrainingSample")


@dataclass(slots=True)
class TrainingSample:
    """One training sequence, ready for a trainer."""

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float
    advantage: float
    episode_id: str
    sample_index: int
    group_id: str
    prompt_len: int
    finish_reason: str
    #: On-policy distillation: a teacher's logprob of each token, beside ``logprobs`` (0.0 on the prompt and on
    #: tokens the model did not generate); None when no teacher scored the sequence.
    teacher_logprobs: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check(self: _S) -> _S:
        n = len(self.input_ids)
        for key in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, key)) != n:
                raise ValueError(f"{key} has {len(getattr(self, key))} entries for {n} input_ids")
        if self.teacher_logprobs is not None and len(self.teacher_logprobs) != n:
            raise ValueError(f"teacher_logprobs has {len(self.teacher_logprobs)} entries for {n} input_ids")
        return self


def sample_tokens(sample: Sample) -> tuple[list[int], list[int], list[float], list[int]]:
    """(input_ids, loss_mask, logprobs, versions) for one sample.

    A generated token's version is its own (``sample.versions``) when the
    sample carries them, else the sample's ``weight_version``.
    """
    n_prompt = len(sample.prompt_ids)
    mask = sample.output_mask
    input_ids = [*sample.prompt_ids, *sample.output_ids]
    loss_mask = [0] * n_prompt + list(mask)
    given = sample.output_logprobs
    per_token = sample.versions
    if per_token is not None and len(per_token) != len(sample.output_ids):
        raise ValueError(f"sample {sample.sample_index} has {len(per_token)} versions for "
                         f"{len(sample.output_ids)} output ids; give one version per output id")
    if type(mask) is list and type(given) is list and mask.count(1) == len(mask):
        # every output token generated (single turn): nothing to choose token by token
        logprobs = [0.0] * n_prompt + list(given[:len(mask)] if len(given) > len(mask) else given)
        if per_token is None:
            versions = [-1] * n_prompt + [version_number(sample.weight_version)] * len(mask)
        else:
            versions = [-1] * n_prompt + list(per_token)
    else:
        logprobs = [0.0] * n_prompt + [lp if m else 0.0 for lp, m in zip(sample.output_logprobs, mask)]
        if per_token is None:
            version = version_number(sample.weight_version)
            versions = [-1] * n_prompt + [version if m else -1 for m in mask]
        else:
            versions = [-1] * n_prompt + [v if m else -1 for v, m in zip(per_token, mask)]
    return input_ids, loss_mask, logprobs, versions


MissingRewardPolicy = Literal["drop", "fail"]
MISSING_REWARD_POLICIES = ("drop", "fail")
StdMode = Literal["unbiased", "population", "none"]
STD_MODES = ("unbiased", "population", "none")
Baseline = Literal["mean", "leave_one_out"]
BASELINES = ("mean", "leave_one_out")


class MissingRewardError(ValueError):
    """A sample has no reward and the trajectory maker's policy is ``missing_reward: fail``."""


def usable_reward(sample: Any) -> float | None:
    """The sample's reward, or None when it has none: not verified (``None``) or not scorable (NaN).

    ``0.0`` is a reward (a wrong answer), never a missing one.
    """
    reward = sample.reward
    if reward is None or math.isnan(reward):
        return None
    return float(reward)


def check_missing_reward_policy(policy: str) -> str:
    if policy not in MISSING_REWARD_POLICIES:
        raise ValueError(f"missing_reward must be 'drop' or 'fail', got {policy!r}")
    return policy


def scored_samples(episode: EpisodeResult, policy: str = "drop") -> tuple[list[Sample], list[float]]:
    """(the episode's samples that have a reward, their rewards), by the missing-reward ``policy``.

    ``drop``: samples without a reward are left out of training data (run
    metrics count them as ``unscored_samples``). ``fail``: such a sample
    raises :class:`MissingRewardError`, which fails the episode. A missing
    reward is never read as 0.0.
    """
    kept: list[Sample] = []
    rewards: list[float] = []
    for position, sample in enumerate(episode.samples):
        reward = usable_reward(sample)
        if reward is not None:
            kept.append(sample)
            rewards.append(reward)
        elif policy == "fail":
            raise MissingRewardError(
                f"sample {position} of episode {episode.episode_id} has no reward (reward {sample.reward!r}: "
                "not verified, or the verifier could not score it); set trajectory.missing_reward: drop to leave "
                "such samples out of the training data instead of failing the episode")
        else:
            check_missing_reward_policy(policy)
    return kept, rewards


class TrajectoryMaker:
    """Base class: turn a finished (successful) episode into training samples.

    ``missing_reward`` is what :meth:`scored` does with a sample that has no
    reward (see :func:`scored_samples`): ``"drop"`` (default) or ``"fail"``.
    """

    missing_reward: str = "drop"

    def make(self, episode: EpisodeResult) -> list[TrainingSample]:  # pragma: no cover - interface
        raise NotImplementedError

    def scored(self, episode: EpisodeResult) -> tuple[list[Sample], list[float]]:
        """The episode's samples that have a reward and their rewards, by this maker's ``missing_reward`` policy."""
        return scored_samples(episode, self.missing_reward)

    @staticmethod
    def build(episode: EpisodeResult, sample: Sample, reward: float, advantage: float) -> TrainingSample:
        input_ids, loss_mask, logprobs, versions = sample_tokens(sample)
        return TrainingSample(
            input_ids=input_ids, loss_mask=loss_mask, logprobs=logprobs, versions=versions,
            reward=float(reward), advantage=float(advantage), episode_id=episode.episode_id,
            sample_index=sample.sample_index, group_id=episode.episode_id,
            prompt_len=len(sample.prompt_ids), finish_reason=sample.finish_reason,
        )


def check_advantage_options(std: str, eps: float, baseline: str) -> None:
    """Validate the group-advantage options (shared by every maker that uses :func:`group_normalized`)."""
    if std not in STD_MODES:
        raise ValueError(f"std must be 'unbiased', 'population' or 'none', got {std!r}")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be 'mean' or 'leave_one_out', got {baseline!r}")
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")


def group_normalized(rewards: Sequence[float], *, std: str = "unbiased", eps: float = 1e-5,
                     baseline: str = "mean") -> list[float]:
    """Group-relative advantages ``(r_i - b_i) / (s + eps)`` of one group's rewards (formulas in docs/runtime.md).

    ``baseline``: ``mean`` (b_i = the group mean, GRPO) or ``leave_one_out``
    (b_i = the mean of the *other* rewards, RLOO; a group of one is its own
    baseline). ``std``: ``unbiased`` (``sqrt(sum((r - mean)^2) / (n - 1))``,
    1 for a group of one; AReaL's default), ``population`` (divides by n),
    or ``none`` (s = 1 and eps = 0: no scaling, Dr. GRPO / RLOO). Computed in
    double precision; a group of equal rewards gives 0, never NaN.
    """
    check_advantage_options(std, eps, baseline)
    n = len(rewards)
    if n == 0:
        return []
    values = [float(r) for r in rewards]
    if min(values) == max(values):  # equal rewards carry no signal: exactly 0 (rounding could leave 1e-12)
        return [0.0] * n
    total = math.fsum(values)
    mean = total / n
    if baseline == "mean":
        centred = [r - mean for r in values]
    elif n == 1:
        centred = [0.0]
    else:
        centred = [r - (total - r) / (n - 1) for r in values]
    if std == "none":
        return centred
    squares = math.fsum((r - mean) ** 2 for r in values)
    if std == "unbiased":
        spread = math.sqrt(squares / (n - 1)) if n > 1 else 1.0
    else:
        spread = math.sqrt(squares / n)
    return [c / (spread + eps) for c in centred]


def rollout_normalized(samples: Sequence[Sample], rewards: Sequence[float], *, std: str = "unbiased",
                       eps: float = 1e-5, baseline: str = "mean") -> list[float]:
    """:func:`group_normalized` over an episode's rollouts: each rollout (``Sample.rollout``; a sample without
    one is its own) counts once with its reward (its samples' mean), and each sample gets its rollout's advantage.
    ``rewards`` are the samples' own, in order. One agent run split into several samples is one member of the
    group, never several equal ones."""
    runs: dict[Any, list[int]] = {}
    for position, sample in enumerate(samples):
        key = ("own", position) if sample.rollout is None else sample.rollout
        runs.setdefault(key, []).append(position)
    run_rewards = [math.fsum(rewards[p] for p in positions) / len(positions) for positions in runs.values()]
    run_advantages = group_normalized(run_rewards, std=std, eps=eps, baseline=baseline)
    advantages = [0.0] * len(samples)
    for positions, advantage in zip(runs.values(), run_advantages):
        for p in positions:
            advantages[p] = advantage
    return advantages
