"""Finding an OpenEnv environment class and turning text into its actions and its observations into text.

An OpenEnv environment is a class deriving from ``openenv.core.env_server.interfaces.Environment`` with
``reset(seed=None, episode_id=None) -> Observation`` and ``step(action) -> Observation``; actions and
observations are pydantic models (``Action``, ``Observation``: ``done``, ``reward``, ``metadata`` and the
environment's own fields). The model writes text, so an action is the model's text in one of the action's
string fields, and an observation is shown as the text of one of its fields.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from scaffold_core.errors import ConfigError, MissingDependencyError

INSTALL_HINT = "pip install 'scaffold-openenv[openenv]' (or: pip install 'openenv-core>=0.3,<0.4')"
#: Observation fields every OpenEnv observation has, never shown to the model.
BASE_FIELDS = ("done", "reward", "metadata")


def environment_base() -> Any:
    try:
        from openenv.core.env_server.interfaces import Environment
    except ImportError as exc:
        raise MissingDependencyError(f"the openenv controller needs openenv-core: {INSTALL_HINT}") from exc
    return Environment


def environment_class(path: str) -> Any:
    """The class ``module:Class`` (or ``module.Class``), checked to be an OpenEnv ``Environment``."""
    base = environment_base()
    module_name, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not name:
        raise ConfigError(f"controller.environment: {path!r} must name a class as module:Class "
                          "(e.g. my_env.server.my_environment:MyEnvironment)")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"controller.environment: cannot import {path!r} ({type(exc).__name__}: {exc}); install "
                          "the environment's package, or put it on PYTHONPATH") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"controller.environment: {path!r} is not an OpenEnv Environment class (a subclass of "
                          "openenv.core.env_server.interfaces.Environment); an environment served elsewhere is "
                          "not run by this controller")
    return cls


def action_type(cls: Any) -> Any:
    """The environment's action model: the annotation of ``step``'s ``action`` parameter."""
    import typing

    hints = typing.get_type_hints(cls.step)
    found = hints.get("action")
    if not isinstance(found, type):
        raise ConfigError(f"OpenEnv environment {cls.__name__}: step(action) has no Action class annotation; "
                          "scaffold builds the action from it")
    return found


def text_field(model: Any, wanted: str | None, what: str) -> str:
    """The string field of ``model`` the model's text goes to (an action) or comes from (an observation):
    ``wanted``, else the only string field besides the base ones."""
    fields = {n: f for n, f in model.model_fields.items() if n not in (*BASE_FIELDS, "metadata")}
    if wanted is not None:
        if wanted not in fields:
            raise ConfigError(f"controller.{what}_field: {model.__name__} has no field {wanted!r} (its fields: "
                              f"{', '.join(fields) or 'none'})")
        return wanted
    strings = [n for n, f in fields.items() if f.annotation is str]
    if len(strings) != 1:
        raise ConfigError(f"controller.{what}_field: {model.__name__} has {len(strings)} string fields "
                          f"({', '.join(strings) or 'none'}); name the one that holds the text")
    return strings[0]


def observation_text(observation: Any, field: str | None) -> str:
    """What the model reads of an observation: its ``field``, else its own fields as JSON (base fields left out)."""
    if field is not None and hasattr(observation, field):
        return str(getattr(observation, field))
    data = observation.model_dump(exclude=set(BASE_FIELDS))
    strings = [v for v in data.values() if isinstance(v, str)]
    if len(data) == 1 and strings:
        return strings[0]
    return json.dumps(data, ensure_ascii=False, default=str)
