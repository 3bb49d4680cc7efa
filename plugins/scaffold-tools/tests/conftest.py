"""scaffold-tools tests: the shared helpers (jail_helpers.py) importable; the python tool's jail, started once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from jail_helpers import FAST, require_jail  # noqa: E402

from scaffold_tools.python_tool import PythonTool  # noqa: E402


@pytest.fixture(scope="session")
def jailed() -> PythonTool:
    """The python tool as configured by default (bubblewrap and the audit hook), with small limits."""
    return require_jail(PythonTool(**FAST))


@pytest.fixture(scope="session")
def jail_only() -> PythonTool:
    """The jail alone, without the audit hook: what holds when a program gets past the hook."""
    return require_jail(PythonTool(audit_hook=False, **FAST))
