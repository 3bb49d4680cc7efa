"""The verl classes the adapter uses, imported only when needed (verl is never a dependency)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scaffold_core.errors import require_module

INSTALL = 'pip install "scaffold-verl[verl]" (it brings Ray, vLLM or SGLang and the GPU training stack)'


@dataclass(frozen=True)
class VerlAPI:
    """verl's agent loop base class, its output model and its registration decorator."""

    AgentLoopBase: type
    AgentLoopOutput: type
    register: Callable[[str], Callable[[type], type]]


def load_api() -> VerlAPI:
    """Import verl's agent loop classes; raises MissingDependencyError with the install command when absent."""
    agent_loop = require_module("verl.experimental.agent_loop.agent_loop", needed_by="scaffold-verl", what="verl",
                                install=INSTALL)
    return VerlAPI(AgentLoopBase=agent_loop.AgentLoopBase, AgentLoopOutput=agent_loop.AgentLoopOutput,
                   register=agent_loop.register)


def rollout_lengths(rollout_config: Any) -> tuple[int, int]:
    """(prompt_length, response_length) from verl's ``actor_rollout_ref.rollout`` config."""
    try:
        return int(rollout_config.prompt_length), int(rollout_config.response_length)
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError("verl's actor_rollout_ref.rollout config needs prompt_length and response_length "
                         f"(integers): {exc}") from exc
