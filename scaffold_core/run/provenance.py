"""What produced a run: scaffold's version, each configured component's plugin and version, key libraries.

Read from package metadata only (nothing is imported), so it is cheap and
safe to call at the end of any command.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from .._meta import CORE_DISTRIBUTION, version
from ..plugins.kinds import SECTION_KINDS

#: Libraries whose versions change what a run computes or how fast.
LIBRARIES = ("torch", "transformers", "datasets", "numpy", "trl", "sglang", "vllm")


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def components(config: dict[str, Any], registry: Any = None) -> dict[str, dict[str, Any]]:
    """section -> ``{name, plugin, distribution, version}`` for each component section of ``config``
    (its ``to_dict()`` or the saved ``config.yaml``); plugin fields are None when the name is not installed."""
    out: dict[str, dict[str, Any]] = {}
    for section, kind in SECTION_KINDS.items():
        body = config.get(section)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        entry: dict[str, Any] = {"name": body["name"], "plugin": None, "distribution": None, "version": None}
        if registry is not None:
            try:
                info = registry.get(kind, body["name"])
            except Exception:  # not installed here (a report of another machine's run)
                info = None
            if info is not None:
                dist = info.distribution or CORE_DISTRIBUTION
                entry.update(plugin=info.plugin, distribution=dist, version=_dist_version(dist))
        out[section] = entry
    return out


def versions(config: dict[str, Any] | None = None, registry: Any = None) -> dict[str, Any]:
    """scaffold's and Python's versions, the configured components' plugins, and the key libraries installed."""
    return {
        CORE_DISTRIBUTION: version(),
        "python": platform.python_version(),
        "components": components(config or {}, registry),
        "libraries": {name: v for name in LIBRARIES if (v := _dist_version(name)) is not None},
    }
