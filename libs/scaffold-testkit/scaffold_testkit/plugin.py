"""A plugin with test and benchmark tasks, for runs that need no dataset plugin.

Not registered by default. Enable it with
``SCAFFOLD_EXTRA_PLUGINS=scaffold_testkit.plugin`` (worker processes
inherit the variable) or ``plugin_set(scaffold_testkit.plugin)``.

* ``list``: :class:`~scaffold_testkit.ListTask` over the ``rows`` given
  in the config (each with ``question``, ``answer`` and optionally ``id``).
* ``arithmetic``: ``count`` deterministic addition questions
  (``What is 17 + 25?`` -> ``42``), ids ``arith-00000``...
* ``flaky_list``: ``list`` whose worker of rank ``crash_rank`` (from
  ``$RANK``) fails while loading: ``crash: exit`` (exit code 3), ``raise``
  or ``hang``. For testing launchers.
* trainer ``rollout_only``: ``steps`` rounds of rollouts (``group`` samples
  per row) with no weight updates, each reported as a step. For testing
  ``scaffold train`` and rollout set-ups without a training library.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge

from scaffold_core.plugins import Help
from scaffold_core.plugins.markers import hookimpl

from .helpers import ListTask


class ConfiguredListTask(ListTask):
    """``list``: the rows come from the config. Defaults to the exact_match verifier."""

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "exact_match"},
                                                "sampling": {"max_tokens": 32}}

    def __init__(self, rows: list[dict[str, Any]] | None = None, system: str | None = None):
        super().__init__(rows, system)


class ArithmeticTask(ListTask):
    """``arithmetic``: ``count`` addition questions, the same for every process that builds them."""

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "exact_match"},
                                                "sampling": {"max_tokens": 32}}

    def __init__(self, count: Annotated[int, Ge(0), Help("questions")] = 16, seed: int = 0, system: str | None = None):
        super().__init__([], system)
        self.count = count
        self.seed = seed

    def load(self) -> Iterable[dict[str, Any]]:
        for i in range(self.count):
            a = (i * 7919 + self.seed * 104729) % 90 + 10
            b = (i * 104723 + self.seed * 7907) % 90 + 10
            yield {"id": f"arith-{i:05d}", "question": f"What is {a} + {b}?", "answer": str(a + b)}


class FlakyListTask(ConfiguredListTask):
    """``flaky_list``: the worker of rank ``crash_rank`` fails while loading its rows."""

    def __init__(self, rows: list[dict[str, Any]] | None = None, crash_rank: int | None = None,
                 crash: str = "exit", system: str | None = None):
        if crash not in ("exit", "raise", "hang"):
            raise ValueError(f"crash must be 'exit', 'raise' or 'hang', got {crash!r}")
        super().__init__(rows, system)
        self.crash_rank = crash_rank
        self.crash = crash

    def load(self) -> Iterable[dict[str, Any]]:
        if self.crash_rank is not None and int(os.environ.get("RANK", "0")) == self.crash_rank:
            print(f"flaky_list: rank {self.crash_rank} crashing ({self.crash})", file=sys.stderr, flush=True)
            if self.crash == "exit":
                os._exit(3)
            if self.crash == "raise":
                raise RuntimeError(f"flaky_list: injected failure on rank {self.crash_rank}")
            time.sleep(3600)
        return super().load()


@hookimpl
def register_tasks(registry: Any) -> None:
    registry.add("list", ConfiguredListTask)
    registry.add("arithmetic", ArithmeticTask)
    registry.add("flaky_list", FlakyListTask)


class RolloutOnlyTrainer:
    """``rollout_only``: ``steps`` rounds of one group per task row each; reports mean reward; never trains.

    ``filter_groups``/``max_refill_rounds`` filter and refill the groups of each step as a GRPO trainer
    would (:mod:`scaffold_core.train.filtering`); each step's rollouts go to ``job.ledger``. It keeps no
    checkpoint: ``--resume`` starts it over.
    """

    def __init__(self, steps: Annotated[int, Ge(1), Help("training steps")] = 2,
                 group: Annotated[int, Ge(1), Help("samples per prompt")] = 2,
                 filter_groups: Literal["none", "zero_variance"] = "none",
                 max_refill_rounds: int = 2):
        from scaffold_core.train.filtering import GroupFilter

        self.steps = steps
        self.group = group
        self.filter = GroupFilter(filter_groups, max_refill_rounds)

    def train(self, job: Any) -> dict[str, Any]:
        import asyncio

        from scaffold_core.train.filtering import refill_from, run_step_groups
        from scaffold_core.train.prompt_groups import TrainingRollouts
        from scaffold_core.trainer import TrainStep

        if job.resume:
            job.rewind(0, None)

        async def loop() -> dict[str, Any]:
            skipped = 0
            async with TrainingRollouts.from_config(job.config, registry=job.registry) as rollouts:
                rows = list(enumerate(rollouts.rows()))
                for step in range(1, self.steps + 1):
                    refill = refill_from(rows, rows, seed=rollouts.sampling.seed, step=step)
                    groups = await run_step_groups(rollouts, rows, samples=self.group, step=step,
                                                   group_filter=self.filter, refill=refill)
                    skipped += groups.skipped
                    if job.ledger is not None:
                        job.ledger.write_step(groups, weight_version=rollouts.weight_version)
                    job.report(TrainStep(step, self.steps, {
                        **groups.metrics(), "version": rollouts.weight_version,
                        "stale_dropped": rollouts.stats.stale_dropped, "skipped": int(groups.skipped),
                        "steps_skipped": skipped}))
                return {"rollouts": rollouts.stats.to_dict(), "steps_skipped": skipped}

        return asyncio.run(loop())


@hookimpl
def register_trainers(registry: Any) -> None:
    registry.add("rollout_only", RolloutOnlyTrainer)
