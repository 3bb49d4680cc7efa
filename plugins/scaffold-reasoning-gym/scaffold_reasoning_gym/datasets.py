"""The library, its datasets (generated once per process for each name, config, size and seed) and their names."""

from __future__ import annotations

import difflib
import json
import threading
from typing import Any

from scaffold_core.errors import ConfigError, MissingDependencyError

INSTALL_HINT = "pip install 'scaffold-reasoning-gym[reasoning-gym]' (or: pip install 'reasoning-gym>=0.1.25,<0.2')"

_MADE: dict[str, Any] = {}
_LOCK = threading.Lock()


def library() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise MissingDependencyError(f"the reasoning_gym task needs the reasoning-gym library: {INSTALL_HINT}") from exc
    return reasoning_gym


def names() -> list[str]:
    """Every dataset the library registers."""
    library()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def dataset(name: str, config: dict[str, Any], size: int, seed: int) -> Any:
    """The library's dataset ``name`` (``create_dataset(name, size=..., seed=..., **config)``), made once per process;
    ConfigError naming the problem (an unknown name with the closest ones, a config the dataset rejects)."""
    key = json.dumps([name, config, size, seed], sort_keys=True, default=str)
    with _LOCK:
        found = _MADE.get(key)
        if found is not None:
            return found
        known = names()
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"task.dataset: reasoning-gym has no dataset {name!r}; {hint}it has {len(known)}: "
                              f"{', '.join(known[:12])}, ... (scaffold_reasoning_gym.datasets.names() lists them)")
        try:
            made = library().create_dataset(name, size=size, seed=seed, **config)
        except Exception as exc:  # its config class rejects a field or a value
            text = " ".join(str(exc).split())[:300]
            raise ConfigError(f"task.config: reasoning-gym dataset {name!r} rejected its config {config!r}: "
                              f"{type(exc).__name__}: {text}") from None
        _MADE[key] = made
        return made
