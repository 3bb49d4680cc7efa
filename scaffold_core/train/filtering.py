"""Groups that teach nothing, left out of a training step and replaced by fresh prompts (bounded).

A GRPO-style trainer learns from the differences between the samples of one
prompt: a group whose rewards are all equal (all wrong, or all right) has
advantage 0 for every sample and moves nothing but the step's cost. With
``filter_groups: zero_variance`` such a group is *filtered*: it is not handed
to the trainer, and more prompts are drawn and rolled out in its place, at most
``max_refill_rounds`` times, so that a step trains on ``prompts`` informative
groups when they exist (DAPO's dynamic sampling, bounded). A step left with no
informative group is *skipped*: the trainer takes no optimizer step.

:func:`run_step_groups` is the one loop every trainer adapter can use::

    step = await run_step_groups(rollouts, rows, samples=8, group_filter=GroupFilter(),
                                 refill=draw_more, step=3)
    step.used       # informative groups, at most len(rows), in the order they were produced
    step.filtered   # the groups left out (their samples are still recorded, as not used)
    step.skipped    # no informative group: take no optimizer step
    step.metrics()  # groups_used, groups_filtered, refill_rounds, reward_mean (every sample of the step)

Group ids name the step, the round and the slot (``s3/r1.0/<row id>``), so a
step's seeds are the same in every run with the same ``sampling.seed``,
whichever process runs it, a resumed one included.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..sampling import derive_seed
from ..task import episode_id_of
from .prompt_groups import RolloutGroup, TrainingRollouts

#: What ``filter_groups`` may be: keep every group, or leave out groups whose rewards are all equal.
FILTERS = ("none", "zero_variance")
#: Rewards closer than this count as equal.
TOLERANCE = 1e-8

#: A row to roll out: its position in the task and the row itself.
IndexedRow = tuple[int, dict[str, Any]]


def zero_variance(group: RolloutGroup) -> bool:
    """Whether every sample of ``group`` has the same reward (a group of one sample or none included)."""
    rewards = group.rewards
    return not rewards or max(rewards) - min(rewards) <= TOLERANCE


@dataclass(frozen=True, slots=True)
class GroupFilter:
    """Which groups a step keeps (``mode``) and how many rounds of fresh prompts replace the others."""

    mode: str = "zero_variance"
    max_refill_rounds: int = 2

    def __post_init__(self) -> None:
        if self.mode not in FILTERS:
            raise ValueError(f"filter_groups must be one of {', '.join(FILTERS)}, got {self.mode!r}")
        if isinstance(self.max_refill_rounds, bool) or not isinstance(self.max_refill_rounds, int) \
                or self.max_refill_rounds < 0:
            raise ValueError(f"max_refill_rounds must be an integer >= 0, got {self.max_refill_rounds!r}")

    def informative(self, group: RolloutGroup) -> bool:
        """Whether ``group`` goes to the trainer."""
        return self.mode == "none" or not zero_variance(group)


#: Keeps every group: what a step did before filtering existed.
KEEP_EVERY_GROUP = GroupFilter(mode="none", max_refill_rounds=0)


@dataclass
class StepGroups:
    """The groups one training step produced: those the trainer gets and those left out."""

    step: int
    wanted: int
    used: list[RolloutGroup] = field(default_factory=list)
    filtered: list[RolloutGroup] = field(default_factory=list)
    refill_rounds: int = 0

    @property
    def skipped(self) -> bool:
        """No informative group: the trainer takes no optimizer step."""
        return not self.used

    @property
    def groups(self) -> list[RolloutGroup]:
        """Every group of the step, used ones first."""
        return [*self.used, *self.filtered]

    def metrics(self) -> dict[str, Any]:
        """``groups_used``, ``groups_filtered``, ``refill_rounds``, ``samples`` and ``reward_mean`` (over every
        sample the step generated, filtered groups included: the policy's reward on what it was asked)."""
        rewards = [r for g in self.groups for r in g.rewards]
        return {"reward_mean": sum(rewards) / len(rewards) if rewards else 0.0, "samples": len(rewards),
                "groups_used": len(self.used), "groups_filtered": len(self.filtered),
                "refill_rounds": self.refill_rounds}


def group_id(step: int, round_: int, slot: int, row: dict[str, Any], index: int) -> str:
    """``s<step>/r<round>.<slot>/<row id>``: the same in every run of the same step."""
    return f"s{step}/r{round_}.{slot}/{episode_id_of(row, index)}"


async def run_step_groups(rollouts: TrainingRollouts, rows: Sequence[IndexedRow], *, samples: int, step: int,
                          group_filter: GroupFilter = KEEP_EVERY_GROUP,
                          refill: Callable[[int, int], Sequence[IndexedRow]] | None = None) -> StepGroups:
    """Roll out one group per row, concurrently; replace the groups ``group_filter`` leaves out.

    ``refill(round, count)`` gives the rows of refill round ``round`` (1, 2, ...): ``count`` of them, or
    fewer when no more can be drawn (the step then ends with what it has). Each round runs as many groups
    as informative ones are missing, so a step never holds more than ``len(rows)`` used groups.
    """
    result = StepGroups(step=step, wanted=len(rows))
    batch = list(rows)
    round_ = 0
    while batch:
        coros = [rollouts.run_group(row, samples=samples, index=index,
                                    group_id=group_id(step, round_, slot, row, index))
                 for slot, (index, row) in enumerate(batch)]
        for group in await asyncio.gather(*coros):
            (result.used if group_filter.informative(group) else result.filtered).append(group)
        missing = result.wanted - len(result.used)
        if missing <= 0 or round_ >= group_filter.max_refill_rounds or refill is None:
            break
        round_ += 1
        batch = list(refill(round_, missing))[:missing]
        if batch:
            result.refill_rounds = round_
    return result


def refill_from(pool: Sequence[IndexedRow], first: Sequence[IndexedRow], *, seed: int | None,
                step: int) -> Callable[[int, int], list[IndexedRow]]:
    """A ``refill`` for :func:`run_step_groups`: rows of ``pool`` drawn at random, rows the step has not tried
    yet first (``first``, then earlier draws), tried ones again only when those run out (a prompt tried again
    gets fresh samples). The draws depend only on ``seed``, ``step`` and the round: every run draws the same."""
    tried = {index for index, _ in first}

    def draw(round_: int, count: int) -> list[IndexedRow]:
        rng = random.Random(derive_seed(seed, "refill", step, round_))
        fresh = [r for r in pool if r[0] not in tried]
        again = [r for r in pool if r[0] in tried]
        rng.shuffle(fresh)
        rng.shuffle(again)
        chosen = (fresh + again)[:count]
        tried.update(index for index, _ in chosen)
        return chosen

    return draw
