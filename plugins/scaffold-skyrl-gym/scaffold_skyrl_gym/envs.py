"""Making skyrl-gym environments and reading what they return.

skyrl-gym environments are gym-style objects: ``env = skyrl_gym.make(id, env_config=..., extras=...)``,
``env.init(prompt) -> (prompt, info)``, ``env.step(action) -> {observations, reward, done, metadata}``,
``env.close()``. They keep their episode's state on themselves, so every episode makes its own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from scaffold_core.errors import EpisodeError, MissingDependencyError

#: Registered environments that run code the model writes on this machine, outside any sandbox.
CODE_EXECUTING = frozenset({"lcb", "searchcode"})
#: Registered environments that call a retrieval server (``env_args.search_url``).
NEEDS_SERVICE = frozenset({"search", "searchcode"})

INSTALL_HINT = "pip install 'scaffold-skyrl-gym[skyrl-gym]' (or: pip install 'skyrl-gym>=0.4,<0.5')"


class GymEnvFailure(EpisodeError):
    """An environment failed or broke its protocol; fails the episode with component ``environment``."""

    def __init__(self, message: str):
        super().__init__(message, component="environment")


def skyrl_gym() -> Any:
    try:
        import skyrl_gym as module
    except ImportError as exc:
        raise MissingDependencyError(f"the skyrl_gym task needs the skyrl-gym library: {INSTALL_HINT}") from exc
    return module


def registered_ids() -> list[str]:
    return sorted(skyrl_gym().registry)


def make_env(env_id: str, env_config: dict[str, Any], extras: dict[str, Any]) -> Any:
    """A fresh environment ``env_id`` (``env_config`` as an OmegaConf config, as SkyRL passes it)."""
    gym = skyrl_gym()
    if env_id not in gym.registry:
        raise GymEnvFailure(f"skyrl-gym has no environment {env_id!r}; registered: {', '.join(sorted(gym.registry))}")
    from omegaconf import OmegaConf

    try:
        return gym.make(env_id, env_config=OmegaConf.create(dict(env_config)), extras=extras)
    except Exception as exc:
        text = " ".join(str(exc).split())
        raise GymEnvFailure(f"skyrl-gym environment {env_id!r} could not be made: {type(exc).__name__}: "
                            f"{text[:300]}") from exc


@dataclass(slots=True)
class Step:
    """One ``env.step`` result, checked."""

    observations: list[dict[str, str]]
    reward: float
    done: bool
    metadata: dict[str, Any] = field(default_factory=dict)


def check_step(env_id: str, out: Any) -> Step:
    """A :class:`Step` from what ``env.step`` returned, or an error naming what is wrong."""
    if not isinstance(out, dict):
        raise GymEnvFailure(f"environment {env_id!r}: step() returned {type(out).__name__}, not a dict with "
                            "observations, reward and done")
    reward = out.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
        raise GymEnvFailure(f"environment {env_id!r}: step() returned reward {reward!r}; a finite number is needed")
    observations = out.get("observations") or []
    if not isinstance(observations, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in observations):
        raise GymEnvFailure(f"environment {env_id!r}: step() returned observations {observations!r}; a list of "
                            "{'role': str, 'content': str} messages is needed")
    return Step(observations=[{"role": m["role"], "content": m["content"]} for m in observations],
                reward=float(reward), done=bool(out.get("done")), metadata=jsonable(out.get("metadata") or {}))


def jsonable(value: Any) -> Any:
    """``value`` if JSON can hold it, else its ``repr`` (metadata is written to the run's store as JSON)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [jsonable(v) for v in value]
        return repr(value)
    return value


def close_quietly(env: Any) -> None:
    """``env.close()``; an error there is not the episode's."""
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing is best effort once the episode's reward is known
        pass


def numeric_metrics(env: Any) -> dict[str, float]:
    """The numbers of ``env.get_metrics()`` (when it has one), as ``env_<name>`` episode metrics."""
    get = getattr(env, "get_metrics", None)
    if get is None:
        return {}
    try:
        found = get() or {}
    except Exception:  # noqa: BLE001 - metrics are optional
        return {}
    return {f"env_{k}": float(v) for k, v in found.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
