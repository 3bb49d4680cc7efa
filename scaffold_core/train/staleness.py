"""How stale a training sample is: how many weight versions behind the engine its oldest token is.

A sample's tokens carry the weight version that sampled them (``versions``,
-1 on prompt and environment tokens). Its staleness is the engine's current
version minus the oldest version among its generated tokens; a sample with
no generated tokens is never stale. ``max_staleness: k`` keeps samples whose
staleness is at most ``k`` (``0``: only samples of the current weights).
This is AReaL's ``max_head_offpolicyness`` applied per sample at hand-off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: What to do with a group that holds a sample older than ``max_staleness``.
STALE_POLICIES = ("drop", "regenerate")


def oldest_version(sample: Any) -> int | None:
    """The oldest weight version among a sample's generated tokens (``None`` when it has none)."""
    versions: Sequence[int] = sample["versions"] if isinstance(sample, dict) else sample.versions
    mask: Sequence[int] = sample["loss_mask"] if isinstance(sample, dict) else sample.loss_mask
    generated = [v for v, m in zip(versions, mask) if m and v >= 0]
    return min(generated) if generated else None


def staleness(sample: Any, current_version: int) -> int:
    """How many versions ``sample``'s oldest generated token is behind ``current_version`` (0 if none)."""
    oldest = oldest_version(sample)
    return 0 if oldest is None else max(0, current_version - oldest)


def is_stale(sample: Any, current_version: int, max_staleness: int | None) -> bool:
    """Whether ``sample`` is older than ``max_staleness`` versions (never when ``max_staleness`` is None)."""
    return max_staleness is not None and staleness(sample, current_version) > max_staleness


def check_policy(max_staleness: int | None, on_stale: str) -> None:
    if max_staleness is not None and (isinstance(max_staleness, bool) or not isinstance(max_staleness, int)
                                      or max_staleness < 0):
        raise ValueError(f"max_staleness must be an integer >= 0 or null, got {max_staleness!r}")
    if on_stale not in STALE_POLICIES:
        raise ValueError(f"on_stale must be one of {', '.join(STALE_POLICIES)}, got {on_stale!r}")


@dataclass(frozen=True, slots=True)
class StalenessPolicy:
    """What a trainer's rollouts do with stale samples (the ``rollout`` section's ``max_staleness`` and ``on_stale``).

    ``max_staleness``: how many weight versions a sample's oldest generated
    token may lag (``None``: keep every sample). ``on_stale``: ``drop`` the
    stale samples, or ``regenerate`` the whole group on the current weights,
    up to ``max_regenerations`` times (then what is still stale is dropped).
    """

    max_staleness: int | None = None
    on_stale: str = "drop"
    max_regenerations: int = 2

    def __post_init__(self) -> None:
        check_policy(self.max_staleness, self.on_stale)
        if isinstance(self.max_regenerations, bool) or not isinstance(self.max_regenerations, int) \
                or self.max_regenerations < 0:
            raise ValueError(f"max_regenerations must be an integer >= 0, got {self.max_regenerations!r}")

    @classmethod
    def from_config(cls, config: Any) -> StalenessPolicy:
        """The policy a resolved :class:`~scaffold_core.config.Config`'s ``rollout`` section sets."""
        return cls(max_staleness=config.rollout.max_staleness, on_stale=config.rollout.on_stale)

    def is_stale(self, sample: Any, current_version: int) -> bool:
        """Whether ``sample`` lags more than ``max_staleness`` versions behind ``current_version``."""
        return is_stale(sample, current_version, self.max_staleness)


#: The policy of a config that sets none: every sample is kept, however old.
KEEP_ALL = StalenessPolicy()
