"""The ``python`` tool: run a short Python program in a jail and return its output.

By default every program runs under bubblewrap (:mod:`scaffold_tools.jail`): fresh namespaces, an
unprivileged user, a read-only view of only the Python runtime, a private size-capped work directory,
no network. Where that is not available the tool refuses to start, saying how to get it; only
``isolation: none`` runs programs without kernel isolation, and says so loudly (at start, in every
result's metadata, and through the agent in the run's metrics). What holds and what does not:
``docs/tools.md``. The machinery is in :mod:`scaffold_tools.sandbox` and :mod:`scaffold_tools.sandbox_boot`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import weakref
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt

from scaffold_core.errors import ConfigError
from scaffold_core.plugins import Help
from scaffold_core.tool import Tool, ToolContext, ToolResult

from .jail import USERNS_HINT, Jail, JailUnavailable, check_bwrap, check_setpriv, host_uid
from .jail_cgroup import Cgroups, find_cgroups
from .jail_root import JailRootError, build_jail_root, cache_dir, describe_runtime
from .jail_seccomp import SeccompUnavailable, seccomp_program
from .sandbox import SandboxLimits, SandboxRun, compiled_boot, run_python
from .sandbox_process import keyring_supported

log = logging.getLogger("scaffold.tools.python")

#: Extra seconds :func:`scaffold_core.tool.invoke_tool` allows beyond the program's wall-clock limit,
#: for starting the interpreter and cleaning up.
STARTUP_MARGIN_S = 5.0
NO_OUTPUT = "(no output: the program printed nothing; use print() to show results)"
UNISOLATED_WARNING = (
    "WARNING: the python tool runs with isolation: none. Programs the model writes run as this user, "
    "with only resource limits and an audit hook (not a security boundary) between them and your files, "
    "keys and network. Use it only for code you trust; remove isolation: none to run them under bubblewrap.")
NO_ISOLATION = "or set isolation: none to run programs without kernel isolation (unsafe for untrusted code)"
REMOVED_NAMESPACES = ("the python tool's option namespaces was replaced by isolation: bubblewrap (the default: "
                      "each program in a kernel jail; the tool refuses to start without one) or isolation: none "
                      "(no kernel isolation, for trusted code only); remove namespaces: {value!r}")


def jail_summary() -> str:
    """One line on the jail the python tool has here with its default options: what ``scaffold list-plugins``
    shows. Changes nothing on the machine."""
    try:
        check_bwrap()
        check_setpriv()
        seccomp_program()
    except (JailUnavailable, SeccompUnavailable) as exc:
        return f"cannot run (the tool refuses to start): {str(exc).removeprefix('python tool: ')}"
    found, why = find_cgroups(change=False)
    limits = found.describe() if found is not None else f"per-process limits and OOM score 1000 ({why})"
    return f"bubblewrap jail with a system-call filter; whole-jail limits: {limits}"


class PythonTool(Tool):
    """Runs Python code in a jail and returns what it printed."""

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

    def __init__(self, timeout: Annotated[float, Gt(0), Help("seconds one call may take")] = 10.0,
                 cpu_seconds: Annotated[int, Gt(0), Help("CPU seconds of one call")] = 5,
                 memory_mb: Annotated[int, Ge(32), Help("address space of one process (the interpreter needs ~20)")]
                 = 512,
                 file_mb: Annotated[int, Gt(0), Help("largest file written")] = 16,
                 workdir_mb: Annotated[int, Gt(0), Help("size of the temporary directory")] = 64,
                 max_output_bytes: Annotated[int, Gt(0), Help("output kept")] = 8192,
                 max_open_files: Annotated[int, Ge(16), Help("open files (the interpreter needs a few)")] = 64,
                 max_processes: Annotated[int, Gt(0)] = 32, max_code_bytes: Annotated[int, Gt(0)] = 100_000,
                 max_concurrent: Annotated[int, Ge(0), Help("calls at once (0: one per CPU core)")] = 0,
                 total_memory_mb: Annotated[int | None, Help("what every process of the jail uses together "
                                                             "(>= memory_mb)")] = None,
                 cpus: Annotated[float, Gt(0), Help("the jail's CPU bandwidth in cores")] = 1.0,
                 cgroup: Literal["auto", "require", "off"] = "auto",
                 isolation: Literal["bubblewrap", "none"] = "bubblewrap", audit_hook: bool = True,
                 site_packages: bool | list[str] = False, print_last_expression: bool = True,
                 python: str | None = None, bwrap: str | None = None, tmp_root: str | None = None,
                 namespaces: Any = None):
        if namespaces is not None:
            raise ValueError(REMOVED_NAMESPACES.format(value=namespaces))
        total_memory_mb = max(2 * memory_mb, memory_mb + workdir_mb) if total_memory_mb is None else total_memory_mb
        if total_memory_mb < memory_mb:
            raise ValueError(f"total_memory_mb ({total_memory_mb}) must be at least memory_mb ({memory_mb}): it is "
                             "what every process of the jail uses together")
        if python is not None and not os.access(python, os.X_OK):
            raise ValueError(f"python {python!r} is not an executable file; give the path of a Python interpreter")
        if tmp_root is not None and not os.path.isdir(tmp_root):
            raise ValueError(f"tmp_root {tmp_root!r} is not a directory")
        self.limits = SandboxLimits(
            wall_seconds=float(timeout), cpu_seconds=int(cpu_seconds), memory_mb=int(memory_mb),
            file_mb=int(file_mb), max_output_bytes=int(max_output_bytes), max_open_files=int(max_open_files),
            max_processes=int(max_processes), workdir_mb=int(workdir_mb), total_memory_mb=int(total_memory_mb),
            cpus=float(cpus))
        self.cgroup = cgroup
        self.timeout = float(timeout) + STARTUP_MARGIN_S
        self.max_code_bytes = max_code_bytes
        self.max_concurrent = max_concurrent or os.cpu_count() or 1
        #: "bubblewrap" or "none": how model-written code is isolated (agents report tools with "none").
        self.isolation = isolation
        self.audit_hook = audit_hook
        self.site_packages = site_packages
        self.print_last_expression = print_last_expression
        self.python = python or sys.executable
        self.bwrap = bwrap
        self.tmp_root = tmp_root
        self._jail: Jail | None = None
        self._cgroups: Cgroups | None = None
        #: How the whole jail's resources are held, as the tool's start-up log and ``list-plugins`` say it.
        self.limits_mode = ""
        self._site_dirs: tuple[str, ...] = ()
        self._boot: str | None = None
        self._ready = False
        self._warned = False
        self._prepare_lock = threading.Lock()
        # One semaphore per event loop (a run may use several loops over its life, e.g. in tests).
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary())

    async def start(self) -> None:
        """Set the jail up and run one program in it; raises :class:`ConfigError` (one line, with the fix)
        where kernel isolation is unavailable. With ``isolation: none``, warns loudly instead."""
        await self._prepare()
        if self._jail is not None:
            run = await self._run("print(1)")
            if run.status != "ok" or run.stdout != "1\n":
                detail = (run.stderr.strip().splitlines() or [f"exit status {run.exit_code}"])[-1]
                raise ConfigError(f"python tool: bubblewrap could not run a program ({detail}); "
                                  f"{USERNS_HINT}, or set isolation: none to run without kernel isolation "
                                  "(unsafe for untrusted code)")

    async def _prepare(self) -> None:
        if not self._ready:
            await asyncio.to_thread(self._prepare_sync)

    def _prepare_sync(self) -> None:
        with self._prepare_lock:
            if self._ready:
                return
            if self.isolation == "none":
                self._warn_unisolated()
                if self.python == sys.executable:
                    self._boot = compiled_boot(cache_dir(None).with_name("python-boot"))
                if self.site_packages:
                    self._site_dirs = describe_runtime(self.python, self.site_packages).site_packages
            else:
                try:
                    bwrap = check_bwrap(self.bwrap)
                    setpriv = check_setpriv()
                    seccomp_program()
                    if not keyring_supported():
                        raise JailUnavailable("python tool: scaffold does not know the keyctl system call of this "
                                              "machine, which gives every call a fresh session keyring; "
                                              f"{NO_ISOLATION}")
                    runtime = describe_runtime(self.python, self.site_packages)
                    root = build_jail_root(runtime, cache_dir(host_uid()), host_uid())
                except (JailUnavailable, JailRootError, SeccompUnavailable) as exc:
                    text = str(exc)
                    raise ConfigError(text if text.startswith("python tool") else f"python tool: {text}") from None
                self._site_dirs = runtime.site_packages
                self._jail = Jail(bwrap, root, self.limits.workdir_mb << 20, setpriv)
                self._cgroups = self._find_cgroups()
            self._ready = True

    def _find_cgroups(self) -> Cgroups | None:
        """The control groups the whole jail is held by, per the ``cgroup`` option; logs which limits hold."""
        found, why = (None, "cgroup: off") if self.cgroup == "off" else find_cgroups()
        limits = self.limits
        if found is not None:
            self.limits_mode = (f"{found.describe()}: memory {limits.total_memory_mb} MiB, {limits.max_processes} "
                                f"tasks, {limits.cpus:g} CPU")
        elif self.cgroup == "require":
            raise ConfigError(f"python tool: cgroup: require, but no control group can be made for the jail ({why}); "
                              "run scaffold as root or in a delegated cgroup (systemd-run --user --scope -p "
                              "Delegate=yes ...), or set cgroup: auto to fall back to per-process limits")
        else:
            self.limits_mode = (f"per-process limits and OOM score 1000 (no control group: {why}); the whole jail's "
                                f"memory is not capped")
        log.info("python tool: bubblewrap jail with a system-call filter; whole-jail limits: %s", self.limits_mode)
        return found

    def _warn_unisolated(self) -> None:
        if not self._warned:
            self._warned = True
            bar = "!" * 78
            print(f"\n{bar}\n{UNISOLATED_WARNING}\n{bar}", file=sys.stderr)
            log.warning("python tool: isolation: none (no kernel isolation)")

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        slot = self._slots.get(loop)
        if slot is None:
            slot = self._slots[loop] = asyncio.Semaphore(self.max_concurrent)
        return slot

    async def _run(self, code: str) -> SandboxRun:
        async with self._slot():
            return await run_python(code, self.limits, jail=self._jail, cgroups=self._cgroups, python=self.python,
                                    site_packages=self._site_dirs, audit_hook=self.audit_hook,
                                    print_last_expression=self.print_last_expression, tmp_root=self.tmp_root,
                                    boot=self._boot)

    async def run_program(self, code: str) -> SandboxRun:
        """Run ``code`` as this tool runs a model's program (the jail set up on first use; one line saying why
        not where it cannot be); what it printed and how it ended. For callers other than agents:
        :func:`scaffold_tools.run_untrusted`."""
        await self._prepare()
        return await self._run(code)

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        code = arguments["code"]
        try:
            size = len(code.encode("utf-8"))
        except UnicodeEncodeError as exc:
            return ToolResult.failure(
                "bad_arguments", f"the program contains a lone surrogate ({code[exc.start]!r} at character "
                f"{exc.start}), which is not text Python can run; write the character itself instead")
        if size > self.max_code_bytes:
            return ToolResult.failure("limit", f"the program is {size} bytes long; the limit is {self.max_code_bytes}")
        if not code.strip():
            return ToolResult.failure("bad_arguments", "the program is empty; send Python code in `code`")
        await self._prepare()
        return self.result(await self._run(code))

    def result(self, run: SandboxRun) -> ToolResult:
        """The ToolResult for a finished run: stdout, plus stderr and a note when it did not end well."""
        metadata = {"exit_code": run.exit_code, "status": run.status, "stdout_bytes": run.stdout_bytes,
                    "stderr_bytes": run.stderr_bytes, "truncated": run.truncated, "isolation": run.isolation,
                    "run_s": run.duration_s}
        if run.oom_kills:
            metadata["oom_kills"] = run.oom_kills
        if run.status == "ok":
            return ToolResult(content=run.stdout if run.stdout else NO_OUTPUT, metadata=metadata)
        limits = self.limits
        note, kind = {
            "error": (f"[the program failed with exit status {run.exit_code}]", "failed"),
            "timeout": (f"[stopped: the program ran longer than its {limits.wall_seconds:g} s time limit]", "timeout"),
            "cpu": (f"[stopped: the program used more than its {limits.cpu_seconds} s of CPU time]", "limit"),
            "memory": ((f"[stopped: the program and what it started needed more than their {limits.total_memory_mb} "
                        "MiB of memory in all]") if run.oom_kills else
                       f"[stopped: the program needed more than its {limits.memory_mb} MiB of memory]", "limit"),
            "forbidden": ("[stopped: the program made a system call the sandbox forbids (another architecture's "
                          "system call interface)]", "failed"),
            "output": (f"[stopped: the program printed more than {limits.max_output_bytes} bytes and kept going]",
                       "limit"),
            "setup": ("[the sandbox could not start the program; this is not the program's fault]", "failed"),
        }[run.status]
        parts = [part.rstrip("\n") for part in (run.stdout, run.stderr) if part.strip()]
        return ToolResult.failure(kind, "\n".join([*parts, note]), **metadata)
