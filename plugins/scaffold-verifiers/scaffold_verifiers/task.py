"""The ``verifiers`` task: a verifiers environment's tasks as scaffold prompts, scored by its rubric.

``task: {name: verifiers, env: my-env, env_args: {...}}`` loads the taskset ``my-env`` (an installed
package, found as verifiers finds it) with ``env_args`` as its ``TasksetConfig`` fields. Each of its tasks
is a row: the prompt is built as the library's tool-less chat harness builds it (system prompt, then the
prompt or its few-shot messages), and the reference is the task's own data, which the ``verifiers``
verifier (the default) turns back into the task to run its rewards.

Environments that need more than one model turn (an ``Env`` of their own, a harness, tools) or a client
(judges) are played by the library's own rollout: the task's default controller, ``verifiers_rollout``, runs
them (and runs single-turn ones as ``native`` does). What cannot run here (a container runtime, a harness
that runs the model's commands on this machine) fails when the task is built, in one line (see
:mod:`scaffold_verifiers.environment`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge

from scaffold_core.errors import DataError
from scaffold_core.plugins import Help
from scaffold_core.task import Task

from .environment import (
    DEFAULT_HARNESS,
    LoadedEnvironment,
    UnsupportedEnvironment,
    check_rollout,
    harness_id,
    has_own_setup,
    load,
    one_line,
    runtime_dependent,
)
from .jail_runtime import warn_host_execution
from .transcript import prompt_messages, rollout_messages

#: The key of the reference that carries a task's wire data.
TASK_KEY = "verifiers_task"


class VerifiersTask(Task):
    """A verifiers environment's tasks (see the module docstring).

    Options:

    * ``env``: the environment id (its package installed; ``owner/name@version`` hub ids work as in verifiers).
    * ``env_args``: the fields of the environment's ``TasksetConfig`` (its dataset knobs, ``task: {...}``).
    * ``harness`` (the taskset's own, else ``null``): the library harness the agents play with. ``null``
      (the library's chat loop, serving the task's MCP tools) plays single-turn tasks in one turn;
      harnesses that need a container or run the model's commands on this machine are refused.
    * ``env_config``: the fields of the environment's ``EnvConfig`` besides the taskset (its agent seats,
      ``max_concurrent_agents``, ``timeout``, ``retries``); agents always run in the ``subprocess`` runtime.
    * ``limit``, ``shuffle`` (with ``seed``): which tasks, applied with the taskset's own views.
    * ``code_execution`` (``jail``): where reward and metric functions that take a ``runtime`` run the
      programs they run (the model's code): ``jail``, scaffold's jail (:mod:`scaffold_verifiers.jail_runtime`);
      ``host``, the agent's runtime on this machine as the library runs them, after a loud warning.
    """

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "verifiers"},
                                                "controller": {"name": "verifiers_rollout"}}

    def __init__(self, env: str, env_args: dict[str, Any] | None = None, harness: str | None = None,
                 env_config: dict[str, Any] | None = None,
                 limit: Annotated[int, Ge(1), Help("tasks at most (null: every task)")] | None = None,
                 shuffle: bool = False,
                 seed: int = 0, code_execution: Literal["jail", "host"] = "jail"):
        super().__init__()
        if env_config is not None and "taskset" in env_config:
            raise ValueError("env_config: the taskset is configured by env and env_args, not env_config.taskset")
        self.env = env
        self.env_args = dict(env_args or {})
        self.env_config = dict(env_config or {})
        self.limit = limit
        self.shuffle = shuffle
        self.seed = seed
        if code_execution not in ("jail", "host"):
            raise ValueError(f"code_execution must be jail (scaffold's jail, the default) or host (this machine, "
                             f"unisolated), got {code_execution!r}")
        self.code_execution = code_execution
        self.loaded: LoadedEnvironment = load(env, self.env_args)
        self.harness = harness_id(self.loaded, harness)
        #: Whether one model turn scored by the rubric is this environment's whole rollout.
        self.single_turn = not self.loaded.problems and self.harness == DEFAULT_HARNESS and not self.env_config
        #: Reward and metric functions that run programs in a runtime (the model's code, in a code rubric).
        self.runs_code: list[str] = []
        if self.single_turn:
            first = next(iter(self.loaded.taskset.take(1)), None)
            self.runs_code = runtime_dependent(first)
            if self.runs_code:  # in the jail, the rubric needs no agent runtime, unless the task prepares one
                self.single_turn = code_execution == "jail" and not has_own_setup(first)
        if not self.single_turn:
            check_rollout(self.loaded, self.harness, self.env_config)
        if code_execution == "host":
            if not self.runs_code:
                self.runs_code = runtime_dependent(next(iter(self.loaded.taskset.take(1)), None))
            if self.runs_code:
                warn_host_execution(env)

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
        try:
            tasks = list(itertools.islice(self._tasks(), self.limit))
        except Exception as exc:
            raise DataError(f"task: verifiers environment {self.env!r} could not load its tasks: "
                            f"{one_line(exc)}") from None
        for task in tasks:
            data = task.data
            if getattr(data, "image", None):
                raise UnsupportedEnvironment(
                    f"task.env: verifiers environment {self.env!r} runs its tasks in container images "
                    f"({data.image!r}): scaffold-verifiers runs the library's agents on this machine, in no container")
            row_id = str(data.id if data.id is not None else data.idx)
            if row_id in seen:
                self.skipped["duplicate id"] += 1
                continue
            seen.add(row_id)
            messages = prompt_messages(data) if self.single_turn else rollout_messages(data)
            rows.append({"id": row_id, "messages": messages, TASK_KEY: data.model_dump(mode="json", exclude_none=True)})
        if not rows:
            raise DataError(f"task: verifiers environment {self.env!r} has no tasks")
        return rows

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(m) for m in row["messages"]]

    def reference(self, row: dict[str, Any]) -> dict[str, Any]:
        """The environment, the task's data and its prompt: what the ``verifiers`` verifier rebuilds the task
        and the transcript from, and what the ``verifiers_rollout`` controller plays (``rollout``: whether the
        library's rollout must play it, with which harness and env config)."""
        reference = {"env": self.env, "env_args": self.env_args, TASK_KEY: row[TASK_KEY], "messages": row["messages"],
                     "code_execution": self.code_execution}
        if not self.single_turn:
            reference["rollout"] = {"harness": self.harness, "env_config": self.env_config}
        return reference
