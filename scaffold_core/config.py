"""YAML configuration: load with ``yaml.safe_load``, apply ``--set`` overrides, resolve defaults, validate.

Resolution order (later wins): built-in defaults < the task's
``default_config`` < the YAML file < ``--set`` overrides. Component sections
(``task``, ``controller``, ``engine``, ``verifier``, ``trajectory``, and the
optional ``trainer``) select a component by ``name``; their other keys are that component's options,
validated against its factory's signature. Everything is validated before any
model loads; every error names the file, the key path, the bad value and what
is allowed.
"""

from __future__ import annotations

import copy
import difflib
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError, DuplicateComponentError, PluginLoadError, UnknownComponentError
from .plugins import SECTION_KINDS, get_registry
from .sampling import SamplingParams
from .textfiles import decode_text

#: Every top-level section, in the order they are resolved and written.
SECTIONS = ("task", "controller", "engine", "sampling", "verifier", "trajectory", "rollout", "output", "trainer")
#: Component sections a config may leave out (``trainer`` is needed by ``scaffold train`` only).
OPTIONAL_SECTIONS = ("trainer",)
#: Section -> component kind, for the sections that select a component (from the one table of kinds).
COMPONENT_SECTIONS: dict[str, str] = {section: SECTION_KINDS[section] for section in SECTIONS
                                      if section in SECTION_KINDS}

_M = TypeVar("_M", bound=BaseModel)

#: Keys of a component section that the core consumes instead of the component.
CORE_KEYS: dict[str, tuple[str, ...]] = {"verifier": ("timeout", "workers")}


class SamplingConfig(BaseModel):
    """``sampling:``. ``max_tokens`` is always sent to the engine explicitly."""

    model_config = ConfigDict(extra="forbid")
    max_tokens: int = Field(512, ge=1, description="integer >= 1")
    temperature: float = Field(1.0, ge=0, description="number >= 0 (0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="number in (0, 1]")
    top_k: int = Field(-1, description="-1 (whole vocabulary) or integer >= 1")
    stop: list[str] = Field(default_factory=list, description="list of strings")
    stop_token_ids: list[int] = Field(default_factory=list, description="list of token ids")
    seed: int | None = Field(0, description="integer or null")

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("top_k must be -1 (whole vocabulary) or >= 1")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def params(self) -> SamplingParams:
        return SamplingParams(self.max_tokens, self.temperature, self.top_p, self.top_k,
                              tuple(self.stop), tuple(self.stop_token_ids), self.seed)


class RolloutConfig(BaseModel):
    """``rollout:``: how episodes run. Every wait has a bound."""

    model_config = ConfigDict(extra="forbid")
    concurrency: int = Field(64, ge=1, description="integer >= 1 (episodes in flight)")
    workers: int = Field(1, ge=1, description="integer >= 1 (worker processes)")
    launcher: Literal["local", "ray"] = Field("local", description="'local' or 'ray'")
    ray_address: str | None = Field(None, description="Ray cluster address, or null for a local Ray")
    ray_num_cpus: float = Field(1.0, ge=0, description="number >= 0 (CPUs each Ray worker actor reserves)")
    ray_num_gpus: float = Field(0.0, ge=0, description="number >= 0 (GPUs each Ray worker actor reserves)")
    ray_startup_timeout: float = Field(600.0, gt=0, description="seconds > 0 to place and start the Ray actors")
    retries: int = Field(0, ge=0, description="integer >= 0 (extra attempts for a failed episode)")
    request_timeout: float = Field(3600.0, gt=0, description="seconds > 0 per engine request")
    episode_timeout: float = Field(7200.0, gt=0, description="seconds > 0 per episode")
    shutdown_timeout: float = Field(30.0, gt=0, description="seconds > 0 to finish in-flight episodes on Ctrl-C")
    worker_timeout: float = Field(86400.0, gt=0, description="seconds > 0 a worker process may run")
    progress: bool | None = Field(None, description="true, false, or null (auto: on a terminal)")
    bad_rows: Literal["skip", "fail"] = Field(
        "skip", description="'skip' (skip and count unusable dataset rows) or 'fail' (stop before any model loads)")
    max_failed_fraction: float = Field(
        0.5, ge=0, le=1, description="number in [0, 1]: above this fraction of failed episodes the run exits non-zero")
    max_staleness: int | None = Field(
        None, ge=0, description="integer >= 0 or null (training: drop or regenerate samples more than this many "
        "weight versions old; null = keep all)")
    on_stale: Literal["drop", "regenerate"] = Field(
        "drop", description="'drop' (drop stale samples) or 'regenerate' (run their group again on current weights)")


class OutputConfig(BaseModel):
    """``output:``: where results go. ``{task}``, ``{controller}`` and ``{time}`` expand in ``dir``."""

    model_config = ConfigDict(extra="forbid")
    dir: str = Field("runs/{task}-{time}", description="a directory path")
    overwrite: bool = Field(False, description="true to replace an existing run's files")
    save_dataset: bool = Field(True, description="write the trajectories as a Hugging Face dataset")
    save_parquet: bool = Field(False, description="also write the trajectories as one Parquet file, "
                                                  "trajectories.parquet (with save_dataset)")
    private: bool = Field(True, description="true: files the run creates are 0600 and its folders 0700; "
                                            "false: the umask decides")
    spans: bool = Field(True, description="record where each episode's time went (queued, prefill, decode, "
                                          "verify, tool calls, weight-update waits) with the episode")
    otel: bool | None = Field(None, description="send each episode's spans as an OpenTelemetry trace (the extra "
                                                "'otel'); null: when an OTEL_TRACES_EXPORTER or "
                                                "OTEL_EXPORTER_OTLP_ENDPOINT variable asks for traces")


@dataclass
class ComponentConfig:
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    core: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.core, **self.options}


@dataclass
class Config:
    """A resolved, validated configuration."""

    task: ComponentConfig
    controller: ComponentConfig
    engine: ComponentConfig
    verifier: ComponentConfig
    trajectory: ComponentConfig
    sampling: SamplingConfig
    rollout: RolloutConfig
    output: OutputConfig
    trainer: ComponentConfig | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task.to_dict(),
            "controller": self.controller.to_dict(),
            "engine": self.engine.to_dict(),
            "sampling": self.sampling.model_dump(),
            "verifier": self.verifier.to_dict(),
            "trajectory": self.trajectory.to_dict(),
            "rollout": self.rollout.model_dump(),
            "output": self.output.model_dump(),
            **({"trainer": self.trainer.to_dict()} if self.trainer is not None else {}),
        }

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)

    @property
    def verifier_timeout(self) -> float:
        return float(self.verifier.core.get("timeout", 30.0))

    @property
    def verifier_workers(self) -> int:
        return int(self.verifier.core.get("workers", 2))


BUILTIN_DEFAULTS: dict[str, Any] = {
    "controller": {"name": "native"},
    "engine": {"name": "transformers"},
    "trajectory": {"name": "single_turn"},
    "verifier": {"timeout": 30.0, "workers": 2},
}


# ---------------------------------------------------------------------------
# Loading and overrides
# ---------------------------------------------------------------------------


def read_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(decode_text(p.read_bytes(), path, error=ConfigError))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections ({', '.join(SECTIONS)}), "
                          f"got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class Unset:
    """``--unset KEY``: remove a key (or a whole section) from the config, so its default applies."""

    key: str


def parse_override(text: str) -> tuple[list[str], Any]:
    import yaml

    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. --set sampling.max_tokens=256")
    key, raw = text.split("=", 1)
    parts = _key_path(key, f"--set {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {text!r}: the value is not valid YAML: {exc}") from None
    return parts, value


def _key_path(key: str, what: str) -> list[str]:
    parts = key.strip().split(".")
    if not key.strip() or any(not p for p in parts):
        raise ConfigError(f"{what}: the key must be a dotted path such as task.limit")
    return parts


def apply_overrides(data: dict[str, Any], overrides: list[str | Unset], *,
                    notes: list[str] | None = None) -> dict[str, Any]:
    """Apply ``--set KEY=VALUE`` and ``--unset KEY`` overrides in order, to a copy of ``data``.

    A value of ``null`` (``--set KEY=null``) removes the key, like ``--unset KEY``, so its default
    applies; only a key of ``sampling``, ``rollout`` or ``output`` that takes null as a value
    (``sampling.seed``, ``rollout.progress``) is set to null instead. Setting a component section's
    ``name`` to another component drops the options the file gave the previous one (they belong to
    it), keeping those set by earlier overrides and the core's keys (``verifier.timeout``, ...);
    each drop adds a line to ``notes``.
    """
    data = copy.deepcopy(data)
    overridden: set[tuple[str, ...]] = set()
    for item in overrides:
        remove = isinstance(item, Unset)
        if isinstance(item, Unset):
            parts, value, what = _key_path(item.key, f"--unset {item.key!r}"), None, f"--unset {item.key!r}"
        else:
            (parts, value), what = parse_override(item), f"--set {item!r}"
            remove = value is None and not _takes_null(parts)
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                if remove:
                    break  # removing a key below a section that is not there: nothing to do
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(f"{what}: {where} is {child!r}, not a section")
            node = child
        else:
            if remove:
                node.pop(parts[-1], None)
            else:
                if len(parts) == 2 and parts[1] == "name" and parts[0] in COMPONENT_SECTIONS:
                    _switch_component(node, parts[0], value, overridden, notes)
                node[parts[-1]] = value
            overridden.add(tuple(parts))
    return data


def _takes_null(parts: list[str]) -> bool:
    """Whether ``parts`` is a key of a typed section whose value may be null (``sampling.seed``)."""
    models: dict[str, type[BaseModel]] = {"sampling": SamplingConfig, "rollout": RolloutConfig,
                                          "output": OutputConfig}
    field = models[parts[0]].model_fields.get(parts[1]) if len(parts) == 2 and parts[0] in models else None
    return field is not None and type(None) in typing.get_args(field.annotation)


def _switch_component(section: dict[str, Any], name: str, new: Any, overridden: set[tuple[str, ...]],
                      notes: list[str] | None) -> None:
    """``--set SECTION.name=NEW`` over the file's other component: drop that component's options."""
    old = section.get("name")
    if old is None or old == new:
        return
    keep = {"name", *CORE_KEYS.get(name, ())} | {p[1] for p in overridden if len(p) == 2 and p[0] == name}
    dropped = sorted(k for k in section if k not in keep)
    for key in dropped:
        del section[key]
    if dropped and notes is not None:
        notes.append(f"--set {name}.name={new}: dropped {', '.join(f'{name}.{k}' for k in dropped)}, the options "
                     f"of the previous {name} {old!r}; set them again with --set if {new!r} takes them")


def _merge_component(default: dict[str, Any] | None, user: Any) -> dict[str, Any]:
    """Merge a component section: the user's ``name`` switching components drops the default's options."""
    if not default:
        return dict(user) if isinstance(user, dict) else user
    if user is None:
        return dict(default)
    if not isinstance(user, dict):
        return user
    if "name" in user and "name" in default and user["name"] != default["name"]:
        core_keys = {k for keys in CORE_KEYS.values() for k in keys}
        core = {k: v for k, v in default.items() if k in core_keys}
        return {**core, **user}
    return {**default, **user}


def load_config(path: str | Path | None = None, overrides: list[str | Unset] | None = None, *,
                data: dict[str, Any] | None = None, registry: Any = None,
                note: Callable[[str], None] | None = None) -> Config:
    """Read, override, resolve and validate a config; raise ConfigError naming what is wrong.

    ``note`` receives what the overrides changed beyond what they name (options dropped when a
    component is switched); by default it is printed on stderr.
    """
    source = str(path) if path is not None else "<config>"
    raw = read_yaml(path) if path is not None else copy.deepcopy(data or {})
    notes: list[str] = []
    raw = apply_overrides(raw, overrides or [], notes=notes)
    for line in notes:
        (note or _print_note)(line)
    try:
        return resolve(raw, registry=registry, source=source)
    except ConfigError as exc:
        message = str(exc)
        if not message.startswith(f"{source}:"):
            message = f"{source}: {message}"
        raise ConfigError(message) from exc.__cause__


def _print_note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr)


def resolve(raw: dict[str, Any], *, registry: Any = None, source: str | None = None) -> Config:
    """Resolve defaults (built-in < task < user) and validate every section; ``registry`` defaults to
    the process-wide one."""
    if registry is None:
        registry = get_registry()
    _check_sections(raw)
    merged = _merge_defaults(raw, _task_defaults(raw, registry))
    components = {section: _component(registry, section, kind, merged.get(section) or {})
                  for section, kind in COMPONENT_SECTIONS.items()
                  if section not in OPTIONAL_SECTIONS or merged.get(section)}
    _check_verifier_core(components["verifier"].core)
    return Config(task=components["task"], controller=components["controller"], engine=components["engine"],
                  verifier=components["verifier"], trajectory=components["trajectory"],
                  sampling=_section(merged, "sampling", SamplingConfig),
                  rollout=_section(merged, "rollout", RolloutConfig),
                  output=_section(merged, "output", OutputConfig), trainer=components.get("trainer"),
                  source=source)


def _section(merged: dict[str, Any], section: str, model: type[_M]) -> _M:
    try:
        return model(**(merged.get(section) or {}))
    except ValidationError as exc:
        raise ConfigError(_pydantic_message(exc, section, model)) from None


def _check_sections(raw: dict[str, Any]) -> None:
    unknown = [k for k in raw if k not in SECTIONS]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), SECTIONS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{key}: unknown section.{hint} Sections: {', '.join(SECTIONS)}")
    for key, value in raw.items():
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{key}: must be a mapping (e.g. {key}: {{name: ...}}), got {value!r}")


def _task_defaults(raw: dict[str, Any], registry: Any) -> dict[str, Any]:
    """The selected task's ``default_config`` (a copy)."""
    task_section = raw.get("task")
    if not task_section or "name" not in task_section:
        raise ConfigError(f"task.name: required; installed tasks: {', '.join(registry.names('task')) or '(none)'}")
    task_info = _lookup(registry, "task", task_section["name"], "task.name")
    defaults = copy.deepcopy(getattr(task_info.factory, "default_config", None) or {})
    return defaults if isinstance(defaults, dict) else {}


def _merge_defaults(raw: dict[str, Any], task_defaults: dict[str, Any]) -> dict[str, Any]:
    """Every section with built-in defaults < the task's defaults < the user's values."""
    merged: dict[str, Any] = {}
    for section in SECTIONS:
        default = _merge_component(BUILTIN_DEFAULTS.get(section), task_defaults.get(section))
        user = raw.get(section)
        if section in COMPONENT_SECTIONS:
            merged[section] = _merge_component(default, user)
        else:
            merged[section] = {**(default or {}), **(user or {})}
    return merged


def _component(registry: Any, section: str, kind: str, body: dict[str, Any]) -> ComponentConfig:
    """Validate one component section: its name is installed and its options build the component."""
    if "name" not in body:
        names = ", ".join(registry.names(kind)) or "(none installed)"
        raise ConfigError(f"{section}.name: required (the task supplies no default); choose one of: {names}")
    name = body["name"]
    if not isinstance(name, str):
        raise ConfigError(f"{section}.name: must be a string, got {name!r}")
    _lookup(registry, kind, name, f"{section}.name")  # unknown or broken names become ConfigErrors
    core_keys = CORE_KEYS.get(section, ())
    core = {k: body[k] for k in core_keys if k in body}
    options = {k: v for k, v in body.items() if k != "name" and k not in core_keys}
    # Build once to validate: factories are cheap (nothing loads before an engine starts),
    # and this catches what a signature cannot (e.g. samples >= 1) before any model loads.
    registry.create(kind, name, options, path=section)
    return ComponentConfig(name, options, core)


def _check_verifier_core(vcore: dict[str, Any]) -> None:
    for key, kind_ok in (("timeout", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0),
                         ("workers", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)):
        if key in vcore and not kind_ok(vcore[key]):
            allowed = "seconds > 0" if key == "timeout" else "integer >= 1"
            raise ConfigError(f"verifier.{key}: got {vcore[key]!r}; expected {allowed}")


def _lookup(registry: Any, kind: str, name: Any, path: str) -> Any:
    try:
        return registry.get(kind, str(name), path=path)
    except UnknownComponentError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(f"{path}:") else f"{path}: {message}") from None
    except (PluginLoadError, DuplicateComponentError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _pydantic_message(exc: ValidationError, section: str, model: type[BaseModel]) -> str:
    lines = []
    fields = model.model_fields
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        key = loc[0] if loc else ""
        path = ".".join([section, *loc])
        if err.get("type") == "extra_forbidden":
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            lines.append(f"{path}: unknown key.{hint} Allowed keys: {', '.join(fields)}")
            continue
        allowed = fields[key].description if key in fields else None
        msg = err.get("msg", "invalid value")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        lines.append(f"{path}: {msg}; got {err.get('input')!r}" + (f". Allowed: {allowed}" if allowed else ""))
    return "\n".join(lines)
