"""A package's public names loaded on first use, so that importing a plugin's root (as ``list-plugins`` does)
stays fast."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name of ``table`` is imported from its submodule (relative to
    ``package``) on first use and kept; any other name is an ``AttributeError``::

        PUBLIC = {"DatasetTask": "task"}
        __getattr__ = lazy_exports(__name__, PUBLIC)
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
