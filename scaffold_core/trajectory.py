"""Training samples: the trajectory-maker contract and the token rules every sample follows.

Token faithfulness: a training sample is ``prompt_ids + output_ids`` exactly
as the engine saw and sampled them (never re-tokenized text). Prompt tokens
and environment tokens get loss mask 0, logprob 0.0 and version -1; tokens
the model generated get loss mask 1, the engine's behaviour logprob, and the
engine's weight version (0 when the engine reports none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from .episode import EpisodeResult, Sample

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check(self: _S) -> _S:
        n = len(self.input_ids)
        for key in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, key)) != n:
                raise ValueError(f"{key} has {len(getattr(self, key))} entries for {n} input_ids")
        return self


def version_number(version: Any) -> int:
    """Integer policy version for the ``versions`` tensor (non-numeric versions map to 0)."""
    if isinstance(version, bool):
        return int(version)
    if isinstance(version, int):
        return version
    try:
        return int(str(version))
    except (TypeError, ValueError):
        return 0


def sample_tokens(sample: Sample) -> tuple[list[int], list[int], list[float], list[int]]:
    """(input_ids, loss_mask, logprobs, versions) for one sample."""
    n_prompt = len(sample.prompt_ids)
    version = version_number(sample.weight_version)
    mask = sample.output_mask
    input_ids = [*sample.prompt_ids, *sample.output_ids]
    loss_mask = [0] * n_prompt + list(mask)
    given = sample.output_logprobs
    if type(mask) is list and type(given) is list and mask.count(1) == len(mask):
        # every output token generated (single turn): nothing to choose token by token
        logprobs = [0.0] * n_prompt + list(given[:len(mask)] if len(given) > len(mask) else given)
        versions = [-1] * n_prompt + [version] * len(mask)
    else:
        logprobs = [0.0] * n_prompt + [lp if m else 0.0 for lp, m in zip(sample.output_logprobs, mask)]
        versions = [-1] * n_prompt + [version if m else -1 for m in mask]
    return input_ids, loss_mask, logprobs, versions


class TrajectoryMaker:
    """Base class: turn a finished (successful) episode into training samples."""

    def make(self, episode: EpisodeResult) -> list[TrainingSample]:  # pragma: no cover - interface
        raise NotImplementedError

    @staticmethod
    def build(episode: EpisodeResult, sample: Sample, reward: float, advantage: float) -> TrainingSample:
        input_ids, loss_mask, logprobs, versions = sample_tokens(sample)
        return TrainingSample(
            input_ids=input_ids, loss_mask=loss_mask, logprobs=logprobs, versions=versions,
            reward=float(reward), advantage=float(advantage), episode_id=episode.episode_id,
            sample_index=sample.sample_index, group_id=episode.episode_id,
            prompt_len=len(sample.prompt_ids), finish_reason=sample.finish_reason,
        )


def group_normalized(rewards: Sequence[float], *, scale: bool = True, eps: float = 1e-6) -> list[float]:
    """GRPO advantages: (r - mean) / (std + eps) within a group (population std)."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    centered = [r - mean for r in rewards]
    if not scale:
        return centered
    std = (sum(c * c for c in centered) / n) ** 0.5
    return [c / (std + eps) for c in centered]


def __getattr__(name: str) -> Any:  # names that moved to another module stay importable from here
    from ._compat import moved_name

    return moved_name(__name__, name)
