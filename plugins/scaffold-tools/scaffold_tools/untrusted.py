"""Running a model's Python program for another plugin: the python tool's jail behind one public function.

Rubrics and environments that execute code a model wrote (a program whose output a reward checks) call
:func:`run_untrusted` instead of starting a process on the host::

    from scaffold_tools import run_untrusted

    result = await run_untrusted(program, timeout=10)
    passed = result.ok and result.stdout.strip() == expected

The program runs exactly as the ``python`` tool runs one (docs/tools.md): under bubblewrap with a system-call
filter, an unprivileged user, no network, a private size-capped work directory, resource limits, and nothing
left behind. Where the jail cannot be made, the call raises :class:`~scaffold_core.errors.ConfigError` in one
line saying why and how to get it, never a silent run on the host. ``isolation="none"`` runs the program with
only the limits (for code the caller trusts, after a loud warning).

One jail is prepared per process for each set of options (the first call pays for it, a few hundred
milliseconds; later calls only start the program).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

#: Statuses of :attr:`UntrustedResult.status` besides "ok": what stopped the program.
STATUSES = ("ok", "error", "timeout", "cpu", "memory", "output", "forbidden", "setup")


@dataclass(frozen=True)
class UntrustedResult:
    """What one program did: its output (cut to the output limit), exit code and how it ended.

    ``status``: ``ok`` (exit 0), ``error`` (nonzero exit), ``timeout``, ``cpu``, ``memory``, ``output``
    (printed far past the limit), ``forbidden`` (killed by the system-call filter), ``setup`` (the jail
    failed, not the program). ``isolation``: ``bubblewrap`` or ``none``.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    status: str
    isolation: str
    duration_s: float
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Whether the program ran to the end and exited with status 0."""
        return self.status == "ok"


_TOOLS: dict[tuple, object] = {}
_LOCK = threading.Lock()


def _tool(options: tuple) -> object:
    from .python_tool import PythonTool

    with _LOCK:
        tool = _TOOLS.get(options)
        if tool is None:
            tool = _TOOLS[options] = PythonTool(**dict(options))
        return tool


async def run_untrusted(code: str, *, timeout: float = 10.0, cpu_seconds: int = 5, memory_mb: int = 512,
                        max_output_bytes: int = 65536, isolation: Literal["bubblewrap", "none"] = "bubblewrap",
                        site_packages: bool | list[str] = False, audit_hook: bool = True) -> UntrustedResult:
    """Run the Python program ``code`` in the python tool's jail and return what it printed.

    ``timeout`` (wall clock, seconds), ``cpu_seconds``, ``memory_mb`` and ``max_output_bytes`` bound it;
    ``site_packages`` (``True``: the packages of this environment, read-only; or a list of folders) lets it
    import more than the standard library; ``audit_hook`` is the second layer inside the jail (an allow-list
    of importable modules): turn it off for programs that need more of the standard library (subprocesses,
    ``multiprocessing``), the jail still holds. ``isolation="none"``: no kernel isolation (trusted code
    only; warns loudly once). Raises :class:`~scaffold_core.errors.ConfigError` where the jail is unavailable.
    """
    options = (("timeout", float(timeout)), ("cpu_seconds", int(cpu_seconds)), ("memory_mb", int(memory_mb)),
               ("max_output_bytes", int(max_output_bytes)), ("isolation", isolation),
               ("site_packages", tuple(site_packages) if isinstance(site_packages, list) else site_packages),
               ("audit_hook", audit_hook), ("print_last_expression", False))
    run = await _tool(options).run_program(code)  # type: ignore[attr-defined]
    return UntrustedResult(stdout=run.stdout, stderr=run.stderr, exit_code=run.exit_code, status=run.status,
                           isolation=run.isolation, duration_s=run.duration_s, truncated=run.truncated)
