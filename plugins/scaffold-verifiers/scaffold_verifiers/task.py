"""The ``verifiers`` task: a verifiers environment's tasks as scaffold prompts, scored by its rubric.

``task: {name: verifiers, env: my-env, env_args: {...}}`` loads the taskset ``my-env`` (an installed
package, found as verifiers finds it) with ``env_args`` as its ``TasksetConfig`` fields. Each of its tasks
is a row: the prompt is built as the library's tool-less chat harness builds it (system prompt, then the
prompt or its few-shot messages), and the reference is the task's own data, which the ``verifiers``
verifier (the default) turns back into the task to run its rewards.

Environments that need more than one model turn (an ``Env`` of their own, a harness, tools) or a client
(judges) fail when the task is built, with one line saying what (see :mod:`scaffold_verifiers.environment`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, ClassVar

from scaffold_core.errors import DataError
from scaffold_core.task import Task

from .environment import LoadedEnvironment, UnsupportedEnvironment, check_single_turn, load, runtime_dependent
from .transcript import prompt_messages

#: The key of the reference that carries a task's wire data.
TASK_KEY = "verifiers_task"


class VerifiersTask(Task):
    """A verifiers environment's tasks (see the module docstring).

    Options:

    * ``env``: the environment id (its package installed; ``owner/name@version`` hub ids work as in verifiers).
    * ``env_args``: the fields of the environment's ``TasksetConfig`` (its dataset knobs, ``task: {...}``).
    * ``harness`` (``null``): how tasks are played; ``null`` (the library's tool-less chat loop: one turn)
      is the one supported today.
    * ``limit``, ``shuffle`` (with ``seed``): which tasks, applied with the taskset's own views.
    """

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "verifiers"}}

    def __init__(self, env: str, env_args: dict[str, Any] | None = None, harness: str = "null",
                 limit: int | None = None, shuffle: bool = False, seed: int = 0):
        super().__init__()
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 (or null for every task), got {limit}")
        if harness != "null":
            raise UnsupportedEnvironment(f"task.harness: {harness!r} runs a program of its own, which "
                                         "scaffold-verifiers does not run yet; use harness: null (one turn, no tools)")
        self.env = env
        self.env_args = dict(env_args or {})
        self.limit = limit
        self.shuffle = shuffle
        self.seed = seed
        self.loaded: LoadedEnvironment = load(env, self.env_args)
        check_single_turn(self.loaded)

    def _tasks(self) -> Iterator[Any]:
        view = self.loaded.taskset
        if self.shuffle:
            view = view.shuffle(self.seed)
        if self.limit is not None:
            view = view.take(self.limit)
        return iter(view)

    def load(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for task in itertools.islice(self._tasks(), self.limit):
            if not rows:
                needy = runtime_dependent(task)
                if needy:
                    raise UnsupportedEnvironment(
                        f"task.env: verifiers environment {self.env!r} scores with {', '.join(needy)}, which "
                        "inspect(s) a runtime (a sandbox the agent worked in); a single-turn run has none")
            data = task.data
            row_id = str(data.id if data.id is not None else data.idx)
            if row_id in seen:
                self.skipped["duplicate id"] += 1
                continue
            seen.add(row_id)
            rows.append({"id": row_id, "messages": prompt_messages(data),
                         TASK_KEY: data.model_dump(mode="json", exclude_none=True)})
        if not rows:
            raise DataError(f"task: verifiers environment {self.env!r} has no tasks")
        return rows

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(m) for m in row["messages"]]

    def reference(self, row: dict[str, Any]) -> dict[str, Any]:
        """The environment, the task's data and its prompt: what the ``verifiers`` verifier rebuilds the task
        and the transcript from."""
        return {"env": self.env, "env_args": self.env_args, TASK_KEY: row[TASK_KEY], "messages": row["messages"]}
