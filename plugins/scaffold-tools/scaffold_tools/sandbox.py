"""Run a Python program in a child process with limits; the machinery behind the ``python`` tool.

One call, :func:`run_python`, does everything and always cleans up:

* with a :class:`~scaffold_tools.jail.Jail` (``isolation: bubblewrap``, the default), the child is
  ``bwrap ... python -I -S -B -u -X utf8 /scaffold-sandbox/boot.pyc CONFIG`` (see :mod:`scaffold_tools.jail`),
  run through a :class:`~scaffold_tools.jail_call.JailCall`: the program is handed over through a memory file
  and written into the jail's private tmpfs (nothing is written on the host), the jail's first process is
  confined before the program starts, and the whole jail is killed when the call ends;
* without one (``isolation: none``), a private temporary directory on the host becomes the child's
  working directory, ``HOME`` and ``TMPDIR``, and is removed afterwards; the child is
  ``python -I -S -B -u -X utf8 sandbox_boot.py CONFIG`` with a minimal environment;
* either way the child starts in a new session (its own process group) with stdin from ``/dev/null`` and a
  fresh session keyring (:mod:`scaffold_tools.sandbox_process`); ``sandbox_boot`` sets the resource limits,
  tells the parent on a pipe of its own that the program is about to start (so that a failure of the
  sandbox is never confused with the program's), and installs the audit hook before the program runs;
* stdout and stderr are read concurrently, keeping the first and last halves of
  ``max_output_bytes`` each; a program that prints far more is stopped;
* on the wall-clock timeout, the caller's cancellation, or normal exit, everything the call started is
  killed with SIGKILL and reaped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .jail import Jail, jail_environment
from .jail_call import JailCall
from .jail_cgroup import Cgroups, JailBudget
from .sandbox_boot import EXIT_MEMORY, encode_config
from .sandbox_process import Child, start_child

BOOT = Path(__file__).with_name("sandbox_boot.py")
#: The leak guard of scaffold's test suite marks processes with this variable; passing it on lets the
#: guard see a child that outlived its run. It carries no secret.
PASSED_ENV = ("SCAFFOLD_TEST_SESSION",)
#: A program that prints more than this beyond its output cap is stopped.
OUTPUT_OVERRUN_BYTES = 1 << 20
READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class SandboxLimits:
    """The limits one run is held to (see :class:`scaffold_tools.python_tool.PythonTool` for meanings)."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    memory_mb: int = 512
    file_mb: int = 16
    max_output_bytes: int = 8192
    max_open_files: int = 64
    max_processes: int = 32
    workdir_mb: int = 64
    #: The whole jail's memory (every process, the work directory's data), where a control group holds it.
    total_memory_mb: int = 1024
    #: The whole jail's CPU bandwidth in cores, where a control group holds it.
    cpus: float = 1.0

    def budget(self) -> JailBudget:
        """What a control group holds the whole jail of one call to."""
        return JailBudget(memory_bytes=self.total_memory_mb << 20, pids=self.max_processes, cpus=self.cpus)


@dataclass
class SandboxRun:
    """What happened to one program."""

    stdout: str
    stderr: str
    exit_code: int | None
    #: "ok", "error" (nonzero exit), "timeout" (wall clock), "cpu" (CPU-time limit), "memory",
    #: "output" (printed far beyond the cap), "forbidden" (killed by the system-call filter) or "setup" (the
    #: sandbox itself failed).
    status: str
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    truncated: bool = False
    #: "bubblewrap" or "none".
    isolation: str = "none"
    duration_s: float = 0.0
    workdir: str = ""
    notes: list[str] = field(default_factory=list)
    #: Processes of the call the kernel killed for want of memory (known only under a control group).
    oom_kills: int = 0


def _passed_env() -> list[tuple[str, str]]:
    return [(name, os.environ[name]) for name in PASSED_ENV if name in os.environ]


def _unjailed_command(python: str, config: dict, boot: str | None) -> list[str]:
    return [python, "-I", "-S", "-B", "-u", "-X", "utf8", boot or str(BOOT), encode_config(config)]


def compiled_boot(cache: Path) -> str:
    """The boot file compiled by this interpreter into ``cache`` (a script given as source is compiled again
    at every start); for ``isolation: none`` with the default interpreter."""
    import hashlib
    import py_compile

    source = BOOT.read_bytes()
    key = hashlib.sha256(source + sys.version.encode() + sys.executable.encode()).hexdigest()[:20]
    target = cache / f"sandbox_boot-{key}.pyc"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        staging = cache / f".{target.name}.{os.getpid()}"
        py_compile.compile(str(BOOT), cfile=str(staging), dfile=str(BOOT), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        os.replace(staging, target)
    return str(target)


def _unjailed_environment(workdir: str) -> dict[str, str]:
    return {"PATH": os.defpath, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir,
            **dict(_passed_env())}


class _Capture:
    """Keeps the head and tail of a stream, counting everything."""

    def __init__(self, cap: int):
        self.head_cap = cap - cap // 2
        self.tail_cap = cap // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_cap:
            self.tail += chunk
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        if not self.truncated:
            return head + self.tail.decode("utf-8", errors="replace")
        omitted = self.total - len(self.head) - len(self.tail)
        tail = self.tail.decode("utf-8", errors="replace")
        return f"{head}\n[... {omitted} bytes of output omitted ...]\n{tail}"


async def _pump(stream: asyncio.StreamReader, capture: _Capture, overrun: asyncio.Event, limit: int) -> None:
    while True:
        chunk = await stream.read(READ_CHUNK)
        if not chunk:
            return
        capture.add(chunk)
        if capture.total > limit:
            overrun.set()


def _remove_tree(path: str) -> None:
    def retry(func, target, _exc):  # a program may have made a file or folder read-only
        parent = os.path.dirname(target)
        try:
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, stat.S_IRWXU)
        except OSError:
            pass
        func(target)

    def retry_or_gone(func, target, exc_info):
        if isinstance(exc_info[1], FileNotFoundError):
            return
        try:
            retry(func, target, exc_info)
        except FileNotFoundError:
            pass

    if os.path.isdir(path):
        shutil.rmtree(path, onerror=retry_or_gone)


def _config(limits: SandboxLimits, *, jailed: bool, audit_hook: bool, print_last_expression: bool,
            site_packages: tuple[str, ...], ready_fd: int) -> dict:
    return {
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": limits.memory_mb << 20,
        "memory_mb": limits.memory_mb,
        "file_bytes": limits.file_mb << 20,
        "max_open_files": limits.max_open_files,
        # The kernel counts RLIMIT_NPROC per user (per user namespace, since Linux 5.14) and never applies it
        # to root: only the jail, entered as an unprivileged user in a namespace of its own, gives the program
        # a count of its own. Outside it, a low limit would count every process of the user.
        "max_processes": limits.max_processes if jailed else None,
        "print_last_expression": print_last_expression,
        "jailed": jailed,
        "audit_hook": audit_hook,
        "site_packages": list(site_packages),
        "ready_fd": ready_fd,
    }


async def run_python(code: str, limits: SandboxLimits, *, jail: Jail | None = None, cgroups: Cgroups | None = None,
                     python: str | None = None, site_packages: tuple[str, ...] = (), audit_hook: bool = True,
                     print_last_expression: bool = True, tmp_root: str | None = None,
                     boot: str | None = None) -> SandboxRun:
    """Run ``code`` under ``limits`` and return what it printed and how it ended.

    With ``jail``, the program runs in it (``python``, ``tmp_root`` and ``boot`` are not used: the jail has
    its own runtime, boot file and work directory), in a control group of ``cgroups`` when given. Without,
    ``boot`` may name a compiled boot file (:func:`compiled_boot`). Never leaves a process or a file behind,
    also when cancelled.
    """
    started = time.monotonic()
    out, err = _Capture(limits.max_output_bytes), _Capture(limits.max_output_bytes)
    ready_read, ready_write = os.pipe()
    os.set_blocking(ready_read, False)
    config = _config(limits, jailed=jail is not None, audit_hook=audit_hook,
                     print_last_expression=print_last_expression, site_packages=site_packages, ready_fd=ready_write)
    call: JailCall | None = None
    child: Child | None = None
    workdir = ""
    status, exit_code, started_program, oom_kills = "setup", None, False, 0
    try:
        if jail is not None:
            call = JailCall(jail, code, encode_config(config), jail_environment(_passed_env()), cgroups=cgroups,
                            budget=limits.budget(), extra_fds=(ready_write,))
            child = await call.start(dict(_passed_env()))
        else:
            workdir = os.path.realpath(tempfile.mkdtemp(prefix="scaffold-python-", dir=tmp_root))
            Path(workdir, "main.py").write_text(code, encoding="utf-8", errors="replace")
            command = _unjailed_command(python or sys.executable, config, boot)
            child = await start_child(command, workdir, _unjailed_environment(workdir), (ready_write,))
        os.close(ready_write)
        ready_write = -1
        kill = call.kill if call is not None else child.kill_group
        status = await _supervise(child, out, err, limits, kill, admit=call.admit if call is not None else None)
        exit_code = await call.exit_code() if call is not None else child.returncode
    finally:
        started_program = _read_ready(ready_read)
        os.close(ready_read)
        if ready_write >= 0:
            os.close(ready_write)
        if call is not None:
            call.kill()
        if child is not None:
            await child.close()  # bubblewrap's group: the jail's first process too, if it was never let go
        if call is not None:
            oom_kills = call.oom_kills()
            await call.end()
        if workdir:
            await _remove_workdir(workdir)
    stderr = err.text()
    if status == "ok":
        status = _status_of(exit_code, jailed=jail is not None, started=started_program, oom_kills=oom_kills)
    return SandboxRun(
        stdout=out.text(), stderr=stderr, exit_code=exit_code, status=status,
        stdout_bytes=out.total, stderr_bytes=err.total, truncated=out.truncated or err.truncated,
        isolation="bubblewrap" if jail is not None else "none", duration_s=round(time.monotonic() - started, 6),
        workdir=workdir, oom_kills=oom_kills)


def _read_ready(fd: int) -> bool:
    """Whether the boot file said the program was about to start (one byte on its pipe)."""
    try:
        return os.read(fd, 1) == b"1"
    except BlockingIOError:
        return False


async def _supervise(child: Child, out: _Capture, err: _Capture, limits: SandboxLimits, kill,
                     admit=None) -> str:
    """Read the output until the program ends, runs out of time or prints far too much; then kill
    everything it started. Returns "ok", "timeout", "output" or "setup" (``admit``, the jail's, failed)."""
    overrun = asyncio.Event()
    limit = limits.max_output_bytes + OUTPUT_OVERRUN_BYTES
    pumps = [asyncio.create_task(_pump(child.stdout, out, overrun, limit)),
             asyncio.create_task(_pump(child.stderr, err, overrun, limit))]
    status = "ok"
    try:
        if admit is not None and not await admit(child):
            status = "setup"  # bubblewrap failed before the program could start: its error is on stderr
            await _wait_for(child.exited.wait(), 5.0)
        else:
            waiter = asyncio.create_task(child.exited.wait())
            overrun_waiter = asyncio.create_task(overrun.wait())
            try:
                done, _ = await asyncio.wait({waiter, overrun_waiter}, timeout=limits.wall_seconds,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                overrun_waiter.cancel()
            if waiter not in done:
                status = "output" if overrun.is_set() else "timeout"
    except BaseException:  # cancelled: stop reading too
        for task in pumps:
            task.cancel()
        raise
    finally:
        # Also after a normal exit: anything the program left running goes now.
        kill()
    await _wait_for(child.exited.wait(), 10.0)
    try:  # the pipes close once every process holding them is gone
        await asyncio.wait_for(asyncio.gather(*pumps, return_exceptions=True), timeout=10)
    except asyncio.TimeoutError:  # held open by a process outside the group: keep what was read
        for task in pumps:
            task.cancel()
    return status


async def _wait_for(awaitable, timeout: float) -> None:
    try:
        await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        pass


async def _remove_workdir(workdir: str) -> None:
    try:
        await asyncio.to_thread(_remove_tree, workdir)
    except asyncio.CancelledError:
        _remove_tree(workdir)  # the thread may still be at it; both tolerate the other
        raise


def _status_of(returncode: int | None, *, jailed: bool, started: bool, oom_kills: int = 0) -> str:
    if returncode == 0:
        return "ok"
    if not started or returncode is None:
        # The program never ran: the sandbox itself failed (bubblewrap, or the boot file's set-up). Told by
        # channels the program cannot write to, never by what it printed.
        return "setup"
    if returncode == EXIT_MEMORY:
        return "memory"
    killed = (-signal.SIGKILL, 128 + signal.SIGKILL) if jailed else (-signal.SIGKILL,)
    if oom_kills and returncode in killed:
        return "memory"  # the control group's OOM killer
    if returncode in (-signal.SIGSYS, 128 + signal.SIGSYS):
        return "forbidden"  # killed by the system-call filter (a system call of another ABI)
    # Nothing of ours sent SIGKILL (that is a timeout or an overrun, set above): the kernel did, at the
    # hard CPU limit, one second after SIGXCPU was ignored or could not be handled. bubblewrap reports a
    # program killed by signal N as exit status 128 + N.
    cpu_signals = (signal.SIGXCPU, signal.SIGKILL)
    if returncode in tuple(-s for s in cpu_signals) or (jailed and returncode in tuple(128 + s for s in cpu_signals)):
        return "cpu"
    return "error"
