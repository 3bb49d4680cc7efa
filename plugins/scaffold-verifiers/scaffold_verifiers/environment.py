"""Loading a verifiers environment and telling which rollout it needs.

In ``verifiers.v1`` an environment is a **taskset** (an installed package, found by module name: ``my-env``
imports ``my_env``) exporting a ``Taskset`` subclass, whose tasks carry the data (``prompt``,
``system_prompt``) and the scoring (``@vf.reward`` / ``@vf.metric`` methods, plugged reward functions and
judges). A **harness** plays the tasks; a taskset may also export its own ``Env`` (multi-agent play, a game
engine playing the user) and tool servers (``Toolset``: MCP servers for the model).

Two paths, and :func:`single_turn_problems` says which one an environment takes:

* **single-turn**: the model answers the prompt in one turn, as the library's tool-less chat harness
  (``null``) plays it, and the task's own ``score`` runs on that transcript (the ``verifiers`` verifier).
  Any scaffold controller can run it (``native``, ``majority_vote``, ...).
* **the library's rollout** (everything else: an ``Env`` of its own, a harness, tools, judges): the
  ``verifiers_rollout`` controller runs ``Env.run_episode`` exactly as the library does (its harness
  program, its tool servers, its scoring) against an OpenAI client bound to a scaffold-serve session
  of the episode, which records the ids the engine sampled on every turn.

:func:`rollout_refusals` lists what even the rollout cannot run here (a container runtime, a harness that
executes the model's commands on this machine): those environments fail when the task is built, in one
line saying why.
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass, field
from typing import Any

from scaffold_core.errors import ConfigError, MissingDependencyError

#: The verifiers releases this plugin is written against (the ``verifiers.v1`` API).
SUPPORTED = "0.4"
INSTALL_HINT = "pip install 'scaffold-verifiers[verifiers]' (or: pip install 'verifiers>=0.4,<0.5')"
#: The controller that runs the library's own rollout (multi-turn, tools, judges).
ROLLOUT_CONTROLLER = "verifiers_rollout"
#: The harness scaffold plays plain tasksets with: the library's tool-less chat loop (it serves MCP tools).
DEFAULT_HARNESS = "null"


class UnsupportedEnvironment(ConfigError):
    """The environment needs something scaffold-verifiers cannot run; the message says which and why."""


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
        legacy = legacy_api(env_id, exc)
        if legacy:
            raise UnsupportedEnvironment(legacy) from None
        raise ConfigError(f"task.env: verifiers environment {env_id!r} could not be loaded: {one_line(exc)}. "
                          "Install its package (pip install <its package>) so that verifiers can import it") from None
    try:
        config = config_cls.model_validate({**(env_args or {}), "id": env_id})
        taskset = load_taskset(config)
    except Exception as exc:
        raise ConfigError(f"task.env_args: verifiers environment {env_id!r} rejected its arguments: "
                          f"{one_line(exc)}") from None
    task_cls = type(taskset).task_type()
    loaded = LoadedEnvironment(env_id, taskset, config, task_cls)
    loaded.problems = single_turn_problems(vf, loaded)
    return loaded


#: What environments written for verifiers before 0.4 use, which 0.4 removed (``verifiers.envs`` and friends).
LEGACY_MARKERS = ("verifiers.envs", "vf.SingleTurnEnv", "vf.MultiTurnEnv", "vf.ToolEnv", "vf.StatefulToolEnv",
                  "vf.Rubric", "vf.JudgeRubric", "vf.XMLParser", "vf.Parser", "vf.Environment",
                  "verifiers.rubrics", "verifiers.parsers", "SingleTurnEnv(", "MultiTurnEnv(")


def legacy_api(env_id: str, exc: BaseException) -> str | None:
    """The one-line message for an environment written for the verifiers API before 0.4 (a
    ``load_environment()`` returning a ``vf.Environment``, the ``verifiers.envs`` modules), else None.

    verifiers 0.4 hides why such an environment fails (it says "not found ... must already be installed"
    while the real cause is ``No module named 'verifiers.envs'``); the cause and the environment's source
    tell the two apart."""
    cause = _legacy_import_error(exc)
    module = env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    source = _module_source(module)
    uses_legacy = bool(source) and "verifiers.v1" not in source and (
        "def load_environment" in source or any(m in source for m in LEGACY_MARKERS))
    if cause is None and not uses_legacy:
        return None
    import verifiers

    why = f"No module named {cause!r}" if cause else "it defines load_environment() and no verifiers.v1 Taskset"
    return (f"task.env: verifiers environment {env_id!r} is written for the verifiers API before 0.4 "
            f"(load_environment() returning a vf.Environment, the verifiers.envs modules), which verifiers "
            f"{verifiers.__version__} (installed) no longer has ({why}); scaffold-verifiers runs environments "
            f"written for verifiers {SUPPORTED}'s verifiers.v1 API. Fix: install a release of the environment "
            "written for verifiers>=0.4 (a vf.Taskset), or port it (its dataset becomes Taskset.load(), its rubric "
            "functions @vf.reward methods); its rows alone run with task: {name: dataset} and a verifier")


def _legacy_import_error(exc: BaseException) -> str | None:
    """The missing ``verifiers.*`` module (not ``verifiers.v1``) among the causes of ``exc``, if any."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        name = getattr(current, "name", None)
        if isinstance(current, ModuleNotFoundError) and isinstance(name, str) and name.startswith("verifiers.") \
                and not name.startswith("verifiers.v1"):
            return name
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _module_source(module: str) -> str:
    """The source of an installed module (its package's ``__init__`` and sibling modules), or ``""``."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    from pathlib import Path

    origin = Path(spec.origin)
    files = sorted(origin.parent.glob("*.py"))[:50] if spec.submodule_search_locations else [origin]
    texts = []
    for path in files:
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace")[:200_000])
        except OSError:
            continue
    return "\n".join(texts)


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


def harness_id(loaded: LoadedEnvironment, harness: str | None) -> str:
    """The harness the environment's agents play with: ``harness``, else the taskset's own, else ``null``
    (the library would pick ``bash``, whose shell tool runs the model's commands on this machine)."""
    from verifiers.v1.utils.loaders import default_harness_id

    if harness:
        return harness
    own = default_harness_id(loaded.env_id)
    return own if own == loaded.env_id else DEFAULT_HARNESS


def rollout_refusals(loaded: LoadedEnvironment, harness: str) -> list[str]:
    """Why the library's rollout of this environment cannot run here (empty: it can).

    Agents run in the library's ``subprocess`` runtime (this machine, no container), so a task or harness
    that needs a container is refused, and so is a harness that hands the model local execution (a shell)."""
    from verifiers.v1.utils.loaders import harness_class

    problems = []
    if getattr(loaded.task_cls, "NEEDS_CONTAINER", False):
        problems.append(f"its tasks ({loaded.task_cls.__name__}) need a container runtime")
    try:
        cls = harness_class(harness)
    except (ImportError, TypeError, AttributeError, ValueError) as exc:
        return [*problems, f"its harness {harness!r} could not be loaded ({one_line(exc)})"]
    if getattr(cls, "NEEDS_CONTAINER", True):
        problems.append(f"its harness {harness!r} needs a container runtime")
    elif getattr(cls, "EXECUTES_CODE", True):
        problems.append(f"its harness {harness!r} runs the model's commands on this machine, outside any jail")
    return problems


def env_config(loaded: LoadedEnvironment, harness: str, options: dict[str, Any] | None = None) -> Any:
    """The library's ``EnvConfig`` for playing this environment here: ``options`` (its fields besides the
    taskset) over the environment's defaults, every agent seat in the ``subprocess`` runtime, and seats
    that pin no harness playing with ``harness``. ConfigError naming the environment when it is invalid."""
    from verifiers.v1 import SubprocessConfig
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.utils.loaders import harness_config_type, resolve_env_config

    try:
        config = resolve_env_config({**(options or {}), "taskset": loaded.config})
        default = harness_config_type(harness).model_validate({"id": harness})
        for name, seat in agent_config_fields(config).items():
            setattr(config, name, seat.model_copy(update={
                "runtime": SubprocessConfig(), "harness": seat.harness if seat.harness is not None else default}))
    except Exception as exc:
        raise ConfigError(f"task.env_config: verifiers environment {loaded.env_id!r} rejected its env config: "
                          f"{one_line(exc)}") from None
    return config


def seat_harnesses(config: Any) -> dict[str, str]:
    """Each agent seat's harness id."""
    from verifiers.v1.configs.agent import agent_config_fields

    return {name: seat.harness.id for name, seat in agent_config_fields(config).items() if seat.harness is not None}


def shipped_refusals(loaded: LoadedEnvironment) -> list[str]:
    """What the tasksets shipped inside verifiers 0.4 need from outside this process, when it is missing
    (``textarena`` cannot even be imported without its game engine and nltk data)."""
    config = loaded.config
    if loaded.env_id == "openenv":
        if importlib.util.find_spec("openenv") is None:
            return ["it steps an OpenEnv environment through the openenv client package, which is not installed"]
        if not getattr(config, "base_url", None):
            return ["it starts its OpenEnv environment with uv or Docker, which install at run time; give "
                    "env_args.base_url of a running OpenEnv server"]
    if loaded.env_id == "nemo_gym" and getattr(config.task, "resources_url", None) is None:
        return ["it needs a NeMo Gym resource server (a managed one installs NeMo Gym under Python 3.12 with uv "
                "at run time); give env_args.task.resources_url of a running server"]
    if loaded.env_id == "harbor":
        return ["its tasks run in Harbor's container images (Docker) and need the Harbor CLI"]
    return []


def check_rollout(loaded: LoadedEnvironment, harness: str, options: dict[str, Any] | None = None) -> Any:
    """The environment's ``EnvConfig`` (see :func:`env_config`); :class:`UnsupportedEnvironment` (one line) when
    the library's rollout cannot run here."""
    config = env_config(loaded, harness, options)
    problems = shipped_refusals(loaded) + rollout_refusals(loaded, harness)
    for seat, seat_harness in seat_harnesses(config).items():
        if seat_harness != harness:
            problems += [f"seat {seat!r}: {p}" for p in rollout_refusals(loaded, seat_harness) if "tasks" not in p]
    if problems:
        raise UnsupportedEnvironment(
            f"task.env: verifiers environment {loaded.env_id!r} cannot run here ({'; '.join(problems)}): "
            "scaffold-verifiers runs the library's agents in its subprocess runtime on this machine, with nothing "
            "from outside (no container, no service it does not find running)")
    return config


def runtime_dependent(task: Any) -> list[str]:
    """The task's reward and metric functions that need a runtime (a sandbox to inspect), by name."""
    names: list[str] = []
    if task is None:
        return names
    for kind in ("reward", "metric"):
        for fn in task.hooks(kind):
            param = inspect.signature(fn).parameters.get("runtime")
            if param is not None and param.default is inspect.Parameter.empty:
                names.append(fn.__name__)
    return names


def has_own_setup(task: Any) -> bool:
    """Whether the task prepares the agent's runtime itself (its own ``setup``), which its rubric may read."""
    if task is None:
        return False
    from verifiers.v1 import Task

    return type(task).setup is not Task.setup


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()).rstrip(".")
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}"
