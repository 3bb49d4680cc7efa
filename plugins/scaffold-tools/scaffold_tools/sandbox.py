"""Run a Python program in a child process with limits; the machinery behind the ``python`` tool.

One call, :func:`run_python`, does everything and always cleans up:

* with a :class:`~scaffold_tools.jail.Jail` (``isolation: bubblewrap``, the default), the child is
  ``bwrap ... python -I -S -B -u -X utf8 /scaffold-sandbox/boot.py CONFIG`` (see :mod:`scaffold_tools.jail`):
  the program is handed over through a memory file and written into the jail's private tmpfs; nothing
  is written on the host, and the tmpfs goes when the jail does;
* without one (``isolation: none``), a private temporary directory on the host becomes the child's
  working directory, ``HOME`` and ``TMPDIR``, and is removed afterwards; the child is
  ``python -I -S -B -u -X utf8 sandbox_boot.py CONFIG`` with a minimal environment;
* either way the child starts in a new session (its own process group) with stdin from ``/dev/null``;
  ``sandbox_boot`` sets the resource limits and installs the audit hook before the program runs;
* stdout and stderr are read concurrently, keeping the first and last halves of
  ``max_output_bytes`` each; a program that prints far more is stopped;
* on the wall-clock timeout, the caller's cancellation, or normal exit, the whole process group
  is killed with SIGKILL and reaped (in the jail, the PID namespace dies with its first process).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .jail import Jail, jail_environment
from .sandbox_boot import EXIT_MEMORY, EXIT_SETUP, encode_config

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


@dataclass
class SandboxRun:
    """What happened to one program."""

    stdout: str
    stderr: str
    exit_code: int | None
    #: "ok", "error" (nonzero exit), "timeout" (wall clock), "cpu" (CPU-time limit), "memory",
    #: "output" (printed far beyond the cap) or "setup" (the sandbox itself failed).
    status: str
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    truncated: bool = False
    #: "bubblewrap" or "none".
    isolation: str = "none"
    duration_s: float = 0.0
    workdir: str = ""
    notes: list[str] = field(default_factory=list)


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


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session, so pgid == pid
    except (ProcessLookupError, PermissionError):
        pass


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
            site_packages: tuple[str, ...]) -> dict:
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
    }


async def run_python(code: str, limits: SandboxLimits, *, jail: Jail | None = None, python: str | None = None,
                     site_packages: tuple[str, ...] = (), audit_hook: bool = True,
                     print_last_expression: bool = True, tmp_root: str | None = None,
                     boot: str | None = None) -> SandboxRun:
    """Run ``code`` under ``limits`` and return what it printed and how it ended.

    With ``jail``, the program runs in it (``python``, ``tmp_root`` and ``boot`` are not used: the jail has
    its own runtime, boot file and work directory). Without, ``boot`` may name a compiled boot file
    (:func:`compiled_boot`). Never leaves a process or a file behind, also when cancelled.
    """
    started = time.monotonic()
    config = _config(limits, jailed=jail is not None, audit_hook=audit_hook,
                     print_last_expression=print_last_expression, site_packages=site_packages)
    out, err = _Capture(limits.max_output_bytes), _Capture(limits.max_output_bytes)
    proc: asyncio.subprocess.Process | None = None
    workdir, code_fd = "", -1
    try:
        if jail is not None:
            code_fd = os.memfd_create("main.py", os.MFD_CLOEXEC)
            os.write(code_fd, code.encode("utf-8", errors="replace"))
            os.lseek(code_fd, 0, os.SEEK_SET)
            env = jail_environment(_passed_env())
            command = jail.command(encode_config(config), code_fd, env)
            proc, exited = await _start(command, "/", dict(_passed_env()), (code_fd,))
        else:
            workdir = os.path.realpath(tempfile.mkdtemp(prefix="scaffold-python-", dir=tmp_root))
            Path(workdir, "main.py").write_text(code, encoding="utf-8", errors="replace")
            command = _unjailed_command(python or sys.executable, config, boot)
            proc, exited = await _start(command, workdir, _unjailed_environment(workdir), ())
        status = await _supervise(proc, exited, out, err, limits)
    finally:
        if code_fd >= 0:
            os.close(code_fd)
        if proc is not None and proc.returncode is None:  # cancelled, or something above failed
            _kill_group(proc)
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except BaseException:  # cancelled again: the event loop's child watcher still reaps it
                pass
        if workdir:
            await _remove_workdir(workdir)
    stderr = err.text()
    if status == "ok" and proc.returncode != 0:
        status = _status_of(proc.returncode, jailed=jail is not None, stderr=stderr)
    return SandboxRun(
        stdout=out.text(), stderr=stderr, exit_code=proc.returncode, status=status,
        stdout_bytes=out.total, stderr_bytes=err.total, truncated=out.truncated or err.truncated,
        isolation="bubblewrap" if jail is not None else "none", duration_s=round(time.monotonic() - started, 6),
        workdir=workdir)


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Also says when the process itself exits: ``Process.wait()`` also waits for its pipes to close
    (on some Python versions), which a leftover process in the group could hold open."""

    def __init__(self, exited: asyncio.Event, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=READ_CHUNK, loop=loop)
        self.exited = exited

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


async def _start(command: list[str], cwd: str, env: dict[str, str],
                 pass_fds: tuple[int, ...]) -> tuple[asyncio.subprocess.Process, asyncio.Event]:
    """Start the child in its own session (so its process group can be killed as a whole)."""
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    transport, protocol = await loop.subprocess_exec(
        lambda: _Protocol(exited, loop), *command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, pass_fds=pass_fds)
    return asyncio.subprocess.Process(transport, protocol, loop), exited


async def _supervise(proc: asyncio.subprocess.Process, exited: asyncio.Event, out: _Capture, err: _Capture,
                     limits: SandboxLimits) -> str:
    """Read the output until the program ends, runs out of time or prints far too much; then kill
    its process group and reap it. Returns "ok", "timeout" or "output"."""
    assert proc.stdout is not None and proc.stderr is not None
    overrun = asyncio.Event()
    limit = limits.max_output_bytes + OUTPUT_OVERRUN_BYTES
    pumps = [asyncio.create_task(_pump(proc.stdout, out, overrun, limit)),
             asyncio.create_task(_pump(proc.stderr, err, overrun, limit))]
    waiter = asyncio.create_task(exited.wait())
    overrun_waiter = asyncio.create_task(overrun.wait())
    status = "ok"
    try:
        done, _ = await asyncio.wait({waiter, overrun_waiter}, timeout=limits.wall_seconds,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            status = "output" if overrun.is_set() else "timeout"
    except BaseException:  # cancelled: stop reading too
        for task in pumps:
            task.cancel()
        raise
    finally:
        overrun_waiter.cancel()
        # Also after a normal exit: anything the program left in its group goes (there should be
        # nothing, since starting processes is refused; this is the backstop).
        _kill_group(proc)
        waiter.cancel()
        try:  # reaped, and every pipe closed
            await asyncio.wait_for(proc.wait(), timeout=10)
        except asyncio.TimeoutError:
            pass
    try:  # the pipes close once every process holding them is gone
        await asyncio.wait_for(asyncio.gather(*pumps, return_exceptions=True), timeout=10)
    except asyncio.TimeoutError:  # held open by a process outside the group: keep what was read
        for task in pumps:
            task.cancel()
    return status


async def _remove_workdir(workdir: str) -> None:
    try:
        await asyncio.to_thread(_remove_tree, workdir)
    except asyncio.CancelledError:
        _remove_tree(workdir)  # the thread may still be at it; both tolerate the other
        raise


#: What bubblewrap and setpriv print when they, not the program, fail.
_JAIL_ERRORS = ("bwrap: ", "setpriv: ")


def _status_of(returncode: int | None, *, jailed: bool = False, stderr: str = "") -> str:
    if returncode == EXIT_MEMORY:
        return "memory"
    if returncode == EXIT_SETUP or (jailed and returncode == 1 and stderr.startswith(_JAIL_ERRORS)):
        return "setup"
    # Nothing of ours sent SIGKILL (that is a timeout or an overrun, set above): the kernel did, at the
    # hard CPU limit, one second after SIGXCPU was ignored or could not be handled. bubblewrap reports a
    # program killed by signal N as exit status 128 + N.
    cpu_signals = (signal.SIGXCPU, signal.SIGKILL)
    if returncode in tuple(-s for s in cpu_signals) or (jailed and returncode in tuple(128 + s for s in cpu_signals)):
        return "cpu"
    return "error"
