"""The AReaL classes the adapter uses, imported only when needed (AReaL is never a dependency)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scaffold_core.errors import require_module

INSTALL = ('pip install "scaffold-areal[areal]" (or install AReaL from source; it needs Python 3.11 or 3.12 and '
           "brings the GPU training stack)")


@dataclass(frozen=True)
class ArealAPI:
    """AReaL's workflow base class and request dataclasses, and whether its batches carry ``turn_ids``.

    ``turn_ids``: AReaL after 2.0.0 builds a ``turn_ids`` key in every
    workflow's tensor dict (and its train engines drop it before the forward
    pass); earlier releases do not know the key.
    """

    RolloutWorkflow: type
    ModelRequest: type
    GenerationHyperparameters: type
    turn_ids: bool = True


def areal_version() -> str | None:
    """The installed AReaL distribution's version, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("areal")
    except PackageNotFoundError:
        return None


def has_turn_ids(version: str | None) -> bool:
    """Whether an AReaL of ``version`` builds ``turn_ids`` (releases from 2.0 on; unknown: yes)."""
    if not version:
        return True
    try:
        return int(version.split(".")[0]) >= 2
    except ValueError:
        return True


def load_api() -> ArealAPI:
    """Import AReaL's classes; raises MissingDependencyError with the install command when AReaL is absent."""
    cli_args, io_struct, workflow_api = require_module(
        "areal.api.cli_args", "areal.api.io_struct", "areal.api.workflow_api", needed_by="scaffold-areal",
        what="AReaL", install=INSTALL)
    return ArealAPI(RolloutWorkflow=workflow_api.RolloutWorkflow, ModelRequest=io_struct.ModelRequest,
                    GenerationHyperparameters=cli_args.GenerationHyperparameters,
                    turn_ids=has_turn_ids(areal_version()))


def as_gconfig(api: ArealAPI, gconfig: Any) -> Any:
    """A GenerationHyperparameters from an instance or a mapping of its fields."""
    if gconfig is None:
        raise ValueError("ScaffoldWorkflow needs gconfig: pass workflow_kwargs=dict(gconfig=config.gconfig, ...) "
                         "(its max_new_tokens, temperature, top_p, top_k, stop and max_tokens are every request's)")
    if isinstance(gconfig, dict):
        return api.GenerationHyperparameters(**gconfig)
    return gconfig
