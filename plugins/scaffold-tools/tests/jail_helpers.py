"""Helpers of the scaffold-tools tests: the python tool with small limits, started where the jail runs."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from scaffold_core.errors import ConfigError
from scaffold_core.tool import ToolContext, ToolResult, invoke_tool
from scaffold_tools.python_tool import PythonTool

#: Small limits, so that the limit tests are quick.
FAST = {"timeout": 8.0, "cpu_seconds": 3, "memory_mb": 256, "file_mb": 1, "max_output_bytes": 4000}


def require_jail(tool: PythonTool) -> PythonTool:
    """Start ``tool``; where bubblewrap cannot run, skip (fail in CI: ``make setup`` installs it there)."""
    try:
        asyncio.run(tool.start())
    except ConfigError as exc:
        if os.environ.get("CI") or not sys.platform.startswith("linux"):
            raise
        pytest.skip(f"kernel isolation is unavailable here: {exc}")
    return tool


def bubblewrap_or_skip() -> None:
    """Skip (fail in CI) where there is no usable bwrap."""
    from scaffold_tools.jail import JailUnavailable, check_bwrap

    try:
        check_bwrap()
    except JailUnavailable as exc:
        if os.environ.get("CI") or not sys.platform.startswith("linux"):
            raise
        pytest.skip(str(exc))


def run_codes(tool: PythonTool, *codes: str, stagger_s: float = 0.0) -> list[ToolResult]:
    """Run every program concurrently (each ``stagger_s`` after the one before); results in order."""
    async def one(i: int, code: str) -> ToolResult:
        await asyncio.sleep(i * stagger_s)
        return await invoke_tool(tool, {"code": code}, ToolContext("ep", f"call-{i}"))

    async def main() -> list[ToolResult]:
        return list(await asyncio.gather(*(one(i, code) for i, code in enumerate(codes))))

    return asyncio.run(main())
