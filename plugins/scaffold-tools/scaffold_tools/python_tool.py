"""The ``python`` tool: run a short Python program in a limited child process and return its output.

A convenience sandbox for model-written code, not a security boundary: see ``docs/tools.md``
(what holds, what does not, and how to put a real one in front). The machinery is in
:mod:`scaffold_tools.sandbox` and :mod:`scaffold_tools.sandbox_boot`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import weakref
from typing import Any, Literal

from scaffold_core.errors import ConfigError
from scaffold_core.tool import Tool, ToolContext, ToolResult

from .sandbox import SandboxLimits, SandboxRun, namespaces_available, run_python

#: Extra seconds :func:`scaffold_core.tool.invoke_tool` allows beyond the program's wall-clock limit,
#: for starting the interpreter and cleaning up.
STARTUP_MARGIN_S = 5.0
NO_OUTPUT = "(no output: the program printed nothing; use print() to show results)"


class PythonTool(Tool):
    """Runs Python code in a separate, limited process and returns what it printed."""

    name = "python"
    description = (
        "Run a Python 3 program and return what it prints (stdout; with the error output when it "
        "fails). Each call starts a fresh interpreter with only the standard library, in an empty "
        "temporary directory, without network access. Use print() to show results; the value of a "
        "final bare expression is printed too."
    )
    parameters = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "The complete Python program to run."},
        },
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(self, timeout: float = 10.0, cpu_seconds: int = 5, memory_mb: int = 512,
                 file_mb: int = 16, max_output_bytes: int = 8192, max_open_files: int = 64,
                 max_processes: int = 32, max_code_bytes: int = 100_000, max_concurrent: int = 0,
                 namespaces: Literal["auto", "on", "off"] = "auto", site_packages: bool = False,
                 print_last_expression: bool = True, python: str | None = None,
                 tmp_root: str | None = None):
        checks = {"timeout": timeout, "cpu_seconds": cpu_seconds, "memory_mb": memory_mb, "file_mb": file_mb,
                  "max_output_bytes": max_output_bytes, "max_open_files": max_open_files,
                  "max_processes": max_processes, "max_code_bytes": max_code_bytes}
        for option, value in checks.items():
            if not value > 0:
                raise ValueError(f"{option} must be positive, got {value}")
        if memory_mb < 32:
            raise ValueError(f"memory_mb must be at least 32 (the interpreter itself needs about 20), got {memory_mb}")
        if max_open_files < 16:
            raise ValueError(f"max_open_files must be at least 16 (the interpreter needs a few), got {max_open_files}")
        if max_concurrent < 0:
            raise ValueError(f"max_concurrent must be 0 (one per CPU core) or more, got {max_concurrent}")
        if python is not None and not os.access(python, os.X_OK):
            raise ValueError(f"python {python!r} is not an executable file; give the path of a Python interpreter")
        if tmp_root is not None and not os.path.isdir(tmp_root):
            raise ValueError(f"tmp_root {tmp_root!r} is not a directory")
        self.limits = SandboxLimits(
            wall_seconds=float(timeout), cpu_seconds=int(cpu_seconds), memory_mb=int(memory_mb),
            file_mb=int(file_mb), max_output_bytes=int(max_output_bytes), max_open_files=int(max_open_files),
            max_processes=int(max_processes))
        self.timeout = float(timeout) + STARTUP_MARGIN_S
        self.max_code_bytes = max_code_bytes
        self.max_concurrent = max_concurrent or os.cpu_count() or 1
        self.namespaces = namespaces
        self.site_packages = site_packages
        self.print_last_expression = print_last_expression
        self.python = python or sys.executable
        self.tmp_root = tmp_root
        self._use_namespaces: bool | None = None
        # One semaphore per event loop (a run may use several loops over its life, e.g. in tests).
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary())

    async def start(self) -> None:
        """Decide once whether to use namespaces; ``namespaces: on`` fails here when they are unavailable."""
        await self._namespaces()

    async def _namespaces(self) -> bool:
        if self._use_namespaces is None:
            if self.namespaces == "off":
                self._use_namespaces = False
            else:
                available = await asyncio.to_thread(namespaces_available)
                if self.namespaces == "on" and not available:
                    raise ConfigError(
                        "python tool: namespaces: on, but `unshare --user --map-root-user --net` does not work on "
                        "this host (unprivileged user namespaces are disabled, or unshare is missing); "
                        "set namespaces: auto to run without them")
                self._use_namespaces = available
        return self._use_namespaces

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        slot = self._slots.get(loop)
        if slot is None:
            slot = self._slots[loop] = asyncio.Semaphore(self.max_concurrent)
        return slot

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        code = arguments["code"]
        size = len(code.encode("utf-8", errors="replace"))
        if size > self.max_code_bytes:
            return ToolResult.failure("limit", f"the program is {size} bytes long; the limit is {self.max_code_bytes}")
        if not code.strip():
            return ToolResult.failure("bad_arguments", "the program is empty; send Python code in `code`")
        namespaces = await self._namespaces()
        async with self._slot():
            run = await run_python(code, self.limits, python=self.python, site_packages=self.site_packages,
                                   namespaces=namespaces, print_last_expression=self.print_last_expression,
                                   tmp_root=self.tmp_root)
        return self.result(run)

    def result(self, run: SandboxRun) -> ToolResult:
        """The ToolResult for a finished run: stdout, plus stderr and a note when it did not end well."""
        metadata = {"exit_code": run.exit_code, "status": run.status, "stdout_bytes": run.stdout_bytes,
                    "stderr_bytes": run.stderr_bytes, "truncated": run.truncated,
                    "network_namespace": run.network_namespace, "run_s": run.duration_s}
        if run.status == "ok":
            return ToolResult(content=run.stdout if run.stdout else NO_OUTPUT, metadata=metadata)
        limits = self.limits
        note, kind = {
            "error": (f"[the program failed with exit status {run.exit_code}]", "failed"),
            "timeout": (f"[stopped: the program ran longer than its {limits.wall_seconds:g} s time limit]", "timeout"),
            "cpu": (f"[stopped: the program used more than its {limits.cpu_seconds} s of CPU time]", "limit"),
            "memory": (f"[stopped: the program needed more than its {limits.memory_mb} MiB of memory]", "limit"),
            "output": (f"[stopped: the program printed more than {limits.max_output_bytes} bytes and kept going]",
                       "limit"),
            "setup": ("[the sandbox could not start the program; this is not the program's fault]", "failed"),
        }[run.status]
        parts = [part.rstrip("\n") for part in (run.stdout, run.stderr) if part.strip()]
        return ToolResult.failure(kind, "\n".join([*parts, note]), **metadata)
