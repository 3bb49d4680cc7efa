"""Loading a verifiers environment and telling which rollout it needs.

In ``verifiers.v1`` an environment is a **taskset** (an installed package, found by module name: ``my-env``
imports ``my_env``) exporting a ``Taskset`` subclass, whose tasks carry the data (``prompt``,
``system_prompt``) and the scoring (``@vf.reward`` / ``@vf.metric`` methods, plugged reward functions and
judges). A **harness** plays the tasks; a taskset may also export its own ``Env`` (multi-agent play, a game
engine playing the user) and tool servers (``Toolset``: MCP servers for the model).

scaffold runs a taskset the way the library's tool-less chat harness (``null``) does: the model answers the
prompt in one turn, then the task's own ``score`` runs on that transcript. That is the **single-turn** path,
and :func:`single_turn_problems` lists why an environment cannot take it.

The seam for the other path: a multi-turn or tool environment runs its own rollout loop (its harness
program, its ``Env.run``) against an OpenAI-compatible endpoint. For scaffold to keep those trajectories
token-faithful, that endpoint must be a ``scaffold serve`` session bound to the episode: the session
records the ids the engine sampled for every turn (prompt tokens, sampled tokens, logprobs, weight version),
appends only newly rendered messages between turns, and reports a split trajectory when the client edits
history. A controller (``verifiers_rollout``) will then run ``Env.run_episode`` with a ``ModelContext``
whose client is that session, read the episode's traces, score them with the task's ``score`` (as the
single-turn path does) and turn the session's recorded turns into one :class:`~scaffold_core.Sample`.
Judges need a client too: the same session's endpoint (a judge call is not trained on) or a configured
one. Until sessions exist, those environments fail with :class:`UnsupportedEnvironment`, one line naming
what is missing.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from scaffold_core.errors import ConfigError, MissingDependencyError

#: The verifiers releases this plugin is written against (the ``verifiers.v1`` API).
SUPPORTED = "0.4"
INSTALL_HINT = "pip install 'scaffold-verifiers[verifiers]' (or: pip install 'verifiers>=0.4,<0.5')"
#: What the multi-turn path is waiting for, as the error says it.
NEEDS_SERVE = ("its own rollout loop needs an OpenAI client bound to a `scaffold serve` session (token-faithful "
               "multi-turn recording)")
#: What judges are waiting for.
NEEDS_CLIENT = "its judges need a model client (a `scaffold serve` session's endpoint or a configured one)"
NOT_YET = "which this version of scaffold-verifiers does not have yet"


class UnsupportedEnvironment(ConfigError):
    """The environment needs a rollout scaffold-verifiers cannot run yet; the message says which and why."""


def library() -> Any:
    """``verifiers.v1``, checked to be a supported release."""
    try:
        import verifiers
        import verifiers.v1 as vf
    except ImportError as exc:
        raise MissingDependencyError(f"the verifiers task needs the verifiers library: {INSTALL_HINT}") from exc
    version = getattr(verifiers, "__version__", "")
    if not version.startswith(SUPPORTED + "."):
        raise MissingDependencyError(f"scaffold-verifiers supports verifiers {SUPPORTED}.x (the verifiers.v1 API); "
                                     f"verifiers {version} is installed: {INSTALL_HINT}")
    return vf


@dataclass
class LoadedEnvironment:
    """A taskset built from its id and arguments, with its task class and config."""

    env_id: str
    taskset: Any
    config: Any
    task_cls: Any
    problems: list[str] = field(default_factory=list)

    def make_task(self, data: dict[str, Any]) -> Any:
        """A task of this taskset from its wire data (``task.data.model_dump(mode="json")``)."""
        return self.task_cls(self.task_cls.data_type().model_validate(data), self.config.task)


def load(env_id: str, env_args: dict[str, Any] | None = None) -> LoadedEnvironment:
    """The taskset ``env_id`` (an installed package, found as verifiers finds it) built with ``env_args``
    (the fields of its ``TasksetConfig``); ConfigError naming the environment when it cannot be built."""
    vf = library()
    from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

    try:
        config_cls = taskset_config_type(env_id)
    except (ImportError, TypeError, AttributeError, ValueError) as exc:
        raise ConfigError(f"task.env: verifiers environment {env_id!r} could not be loaded: {_one_line(exc)}. "
                          "Install its package (pip install <its package>) so that verifiers can import it") from None
    try:
        config = config_cls.model_validate({**(env_args or {}), "id": env_id})
        taskset = load_taskset(config)
    except Exception as exc:
        raise ConfigError(f"task.env_args: verifiers environment {env_id!r} rejected its arguments: "
                          f"{_one_line(exc)}") from None
    task_cls = type(taskset).task_type()
    loaded = LoadedEnvironment(env_id, taskset, config, task_cls)
    loaded.problems = single_turn_problems(vf, loaded)
    return loaded


def single_turn_problems(vf: Any, loaded: LoadedEnvironment) -> list[str]:
    """Why the environment cannot run as one model turn scored by its rubric (empty: it can)."""
    from verifiers.v1.utils.loaders import default_harness_id, environment_class

    problems = []
    env_id, config, task_cls = loaded.env_id, loaded.config, loaded.task_cls
    if environment_class(env_id) is not vf.SingleAgentEnv:
        problems.append("it defines its own Env (agents that interact, or a simulated user)")
    if default_harness_id(env_id) == env_id:
        problems.append("it ships its own harness")
    if type(loaded.taskset).toolsets(config) or task_cls.toolsets(config.task):
        problems.append("it gives the model tools (toolsets)")
    if getattr(task_cls, "NEEDS_CONTAINER", False):
        problems.append("its tasks need a container")
    if config.task.judges:
        problems.append("its rubric has judges (model calls that need a client)")
    return problems


def check_single_turn(loaded: LoadedEnvironment) -> None:
    """Raise :class:`UnsupportedEnvironment` (one line) unless the environment is single-turn."""
    if loaded.problems:
        judges_only = all("judges" in p for p in loaded.problems)
        needs = NEEDS_CLIENT if judges_only else NEEDS_SERVE
        raise UnsupportedEnvironment(f"task.env: verifiers environment {loaded.env_id!r} is not single-turn ("
                                     f"{'; '.join(loaded.problems)}): {needs}, {NOT_YET}")


def runtime_dependent(task: Any) -> list[str]:
    """The task's reward and metric functions that need a runtime (a sandbox to inspect), by name."""
    names = []
    for kind in ("reward", "metric"):
        for fn in task.hooks(kind):
            param = inspect.signature(fn).parameters.get("runtime")
            if param is not None and param.default is inspect.Parameter.empty:
                names.append(fn.__name__)
    return names


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()).rstrip(".")
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}"
