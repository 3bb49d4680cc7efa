"""Held-out evaluation during training: fixed prompts, sampled on the current weights every N steps.

A trainer builds the held-out rows once (:func:`eval_task`: the training
task with other options, e.g. ``{split: test}`` or ``{rows: [...]}``) and
calls :func:`evaluate` between steps. It reports, with the step's metrics:

* ``eval_reward_mean``: the mean reward of every held-out sample;
* ``eval_pass@1``: the mean, over held-out prompts, of the fraction of its
  samples that are correct (reward > 0, as ``scaffold eval`` counts them);
* ``eval_prompts`` and ``eval_failed``: prompts evaluated, episodes that failed
  (left out of both figures, never counted as 0).

Group ids name the step (``eval<step>/<row id>``), so the seeds of an
evaluation are the same in every run; its episodes do not count in the
rollouts' statistics and are not written to the store.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from scaffold_core.task import episode_id_of
from scaffold_core.train.prompt_groups import TrainingRollouts


def eval_task(config: Any, registry: Any, options: dict[str, Any]) -> Any:
    """The training task built again with ``options`` over its own (``trainer.eval_task``)."""
    merged = {**dict(config.task.options), **dict(options)}
    return registry.create("task", config.task.name, merged, path="trainer.eval_task")


async def evaluate(rollouts: TrainingRollouts, task: Any, rows: list[dict[str, Any]], *, samples: int,
                   step: int) -> dict[str, Any]:
    """``eval_reward_mean``, ``eval_pass@1``, ``eval_prompts``, ``eval_failed`` of ``rows`` (rendered by ``task``)
    with ``samples`` samples each, on the engine's current weights."""
    stats = copy.copy(rollouts.stats)
    try:
        groups = await asyncio.gather(*(
            rollouts.run_group(row, samples=samples, index=i, task=task, group_id=f"eval{step}/{episode_id_of(row, i)}")
            for i, row in enumerate(rows)))
    finally:
        rollouts.stats = stats
    rewards: list[float] = []
    passes: list[float] = []
    for group in groups:
        scored = [r for r in group.rewards if r is not None]
        if scored:
            rewards.extend(scored)
            passes.append(sum(1 for r in scored if r > 0) / len(scored))
    return {"eval_reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "eval_pass@1": sum(passes) / len(passes) if passes else None,
            "eval_prompts": len(passes), "eval_failed": sum(len(g.failed) for g in groups)}
