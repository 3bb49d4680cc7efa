"""The ``verifiers`` verifier: a verifiers task's own scoring, on the model's response.

The reference (from the ``verifiers`` task) names the environment and carries the task's data and prompt.
The verifier rebuilds the task, records the prompt and the response as the library records a model call,
and runs the task's ``score``: every ``@vf.reward`` function (weighted; async ones awaited) and
``@vf.metric`` function, plugged functions included, exactly as the library's offline scoring does. The
reward is the library's weighted sum (``trace.reward``); each function's value is kept in the verdict's
metrics (``reward/<name>``, ``metric/<name>``), so it lands with the sample in the run's store (episodes.db) and,
averaged, in metrics.json. A scoring error fails the episode; a reward function that gave no value is an
error too, never a zero.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from typing import Any

from scaffold_core.errors import VerifierError
from scaffold_core.verifier import Reference, Verdict, Verifier

from .environment import LoadedEnvironment, load, runtime_dependent
from .jail_runtime import jail_runtime_class
from .task import TASK_KEY
from .transcript import one_turn_trace

_LOADED: dict[str, LoadedEnvironment] = {}
_LOCK = threading.Lock()


def loaded_environment(env: str, env_args: dict[str, Any]) -> LoadedEnvironment:
    """The environment, loaded once per process for each (id, arguments)."""
    key = json.dumps([env, env_args], sort_keys=True, default=str)
    with _LOCK:
        found = _LOADED.get(key)
        if found is None:
            found = _LOADED[key] = load(env, env_args)
        return found


class VerifiersRubric(Verifier):
    """Scores a response with its verifiers task's rubric (see the module docstring).

    Options: ``reward_range`` (``[-1000, 1000]``): the lowest and highest reward the rubric gives (a
    weighted sum of reward functions has no fixed range; a reward outside it fails the episode).
    """

    executor = "thread"

    def __init__(self, reward_range: tuple[float, float] = (-1000.0, 1000.0)):
        low, high = (float(x) for x in reward_range)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"reward_range must be two finite numbers, low < high; got {reward_range!r}")
        setattr(self, "reward_range", (low, high))  # noqa: B010 - an instance value of the class-level contract

    def verify(self, response: str, reference: Reference) -> Verdict:
        if not isinstance(reference, dict) or TASK_KEY not in reference or "env" not in reference:
            raise VerifierError(f"the verifiers verifier scores the verifiers task's rows; got reference "
                                f"{str(reference)[:80]!r}: use task: {{name: verifiers, env: ...}}")
        if reference.get("rollout"):
            raise VerifierError(f"verifiers environment {reference['env']!r} is played by the library's own rollout "
                                "(more than one turn, tools or judges), not scored on one response: use controller: "
                                "{name: verifiers_rollout} (the verifiers task's default), with samples: N for several "
                                "rollouts per prompt (majority_vote and best_of_n re-score single responses)")
        env_args: Any = reference.get("env_args") or {}
        data: Any = reference[TASK_KEY]
        messages: Any = reference["messages"]
        loaded = loaded_environment(str(reference["env"]), dict(env_args))
        task = loaded.make_task(data)
        trace = one_turn_trace(task, list(messages), response)
        runtime = jail_runtime_class()() if runtime_dependent(task) else None  # a code rubric: in the jail
        asyncio.run(task.score(trace, runtime))
        return verdict_of(trace)


def verdict_of(trace: Any) -> Verdict:
    """The library's weighted reward of a scored trace, each function's value in the metrics."""
    missing = [name for name, reward in trace.rewards.items() if reward is None]
    if missing:
        raise VerifierError(f"reward function(s) {', '.join(missing)} gave no value")
    metrics = {f"reward/{name}": float(r.score) for name, r in trace.rewards.items()}
    metrics.update({f"metric/{name}": float(v) for name, v in trace.metrics.items() if v is not None})
    parts = ", ".join(f"{name} {r.score:g}" + (f" x{r.weight:g}" if r.weight != 1.0 else "")
                      for name, r in trace.rewards.items())
    reward = float(trace.reward)
    return Verdict(reward, reason=f"rubric: {parts or 'no reward functions'} = {reward:g}", metrics=metrics)
