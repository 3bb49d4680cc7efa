"""Run a Python program in a child process with limits; the machinery behind the ``python`` tool.

One call, :func:`run_python`, does everything and always cleans up:

* a private temporary directory becomes the child's working directory, ``HOME`` and ``TMPDIR``;
  it is removed afterwards, whatever happened (also when the caller is cancelled);
* the child is ``python -I [-S] -B -u -X utf8 sandbox_boot.py CONFIG`` in a new session (its own
  process group), with stdin from ``/dev/null`` and a minimal environment; ``sandbox_boot`` sets
  the resource limits and installs the audit hook before the program runs (see that module);
* where the host lets unprivileged users create namespaces (``unshare --user --map-root-user
  --net`` works; checked once per process), the child also runs in a fresh user and network
  namespace: no network interfaces but a loopback that is down;
* stdout and stderr are read concurrently, keeping the first and last halves of
  ``max_output_bytes`` each; a program that prints far more is stopped;
* on the wall-clock timeout, the caller's cancellation, or normal exit, the whole process group
  is killed with SIGKILL and reaped.
"""

from __future__ import annotations

import asyncio
import functools
import json
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

from .sandbox_boot import EXIT_MEMORY, EXIT_SETUP

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
    network_namespace: bool = False
    duration_s: float = 0.0
    workdir: str = ""
    notes: list[str] = field(default_factory=list)


@functools.cache
def namespaces_available() -> bool:
    """Whether ``unshare --user --map-root-user --net`` works here (checked once per process)."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return False
    try:
        proc = subprocess.run([unshare, "--user", "--map-root-user", "--net", "--", "true"],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def _command(python: str, *, site_packages: bool, namespaces: bool, config: dict) -> list[str]:
    cmd = []
    if namespaces:
        cmd += [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--net", "--"]
    cmd += [python, "-I"]
    if not site_packages:
        cmd.append("-S")
    cmd += ["-B", "-u", "-X", "utf8", str(BOOT), json.dumps(config)]
    return cmd


def _environment(workdir: str) -> dict[str, str]:
    env = {"PATH": os.defpath, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    for name in PASSED_ENV:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


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


async def run_python(code: str, limits: SandboxLimits, *, python: str | None = None,
                     site_packages: bool = False, namespaces: bool = False,
                     print_last_expression: bool = True, tmp_root: str | None = None) -> SandboxRun:
    """Run ``code`` under ``limits`` and return what it printed and how it ended.

    Never leaves a process or a file behind, also when cancelled. ``namespaces=True`` runs the child
    under ``unshare`` and needs :func:`namespaces_available`.
    """
    started = time.monotonic()
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="scaffold-python-", dir=tmp_root))
    out, err = _Capture(limits.max_output_bytes), _Capture(limits.max_output_bytes)
    proc: asyncio.subprocess.Process | None = None
    try:
        Path(workdir, "main.py").write_text(code, encoding="utf-8")
        config = {
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": limits.memory_mb << 20,
            "memory_mb": limits.memory_mb,
            "file_bytes": limits.file_mb << 20,
            "max_open_files": limits.max_open_files,
            # The kernel counts RLIMIT_NPROC per user; only a fresh user namespace gives the program a
            # count of its own (and for root it is not enforced at all). Outside one, a low limit would
            # count every process of the user and could keep the program from starting a thread.
            "max_processes": limits.max_processes if namespaces else None,
            "print_last_expression": print_last_expression,
        }
        command = _command(python or sys.executable, site_packages=site_packages, namespaces=namespaces,
                           config=config)
        proc, exited = await _start(command, workdir)
        status = await _supervise(proc, exited, out, err, limits)
    finally:
        if proc is not None and proc.returncode is None:  # cancelled, or something above failed
            _kill_group(proc)
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except BaseException:  # cancelled again: the event loop's child watcher still reaps it
                pass
        await _remove_workdir(workdir)
    if status == "ok" and proc.returncode != 0:
        status = _status_of(proc.returncode)
    return SandboxRun(
        stdout=out.text(), stderr=err.text(), exit_code=proc.returncode, status=status,
        stdout_bytes=out.total, stderr_bytes=err.total, truncated=out.truncated or err.truncated,
        network_namespace=namespaces, duration_s=round(time.monotonic() - started, 6), workdir=workdir)


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Also says when the process itself exits: ``Process.wait()`` also waits for its pipes to close
    (on some Python versions), which a leftover process in the group could hold open."""

    def __init__(self, exited: asyncio.Event, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=READ_CHUNK, loop=loop)
        self.exited = exited

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


async def _start(command: list[str], workdir: str) -> tuple[asyncio.subprocess.Process, asyncio.Event]:
    """Start the child in its own session (so its process group can be killed as a whole)."""
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    transport, protocol = await loop.subprocess_exec(
        lambda: _Protocol(exited, loop), *command, cwd=workdir, env=_environment(workdir),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
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


def _status_of(returncode: int | None) -> str:
    if returncode == EXIT_MEMORY:
        return "memory"
    if returncode == EXIT_SETUP:
        return "setup"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        # Nothing of ours sent SIGKILL (that is a timeout or an overrun, set above): the kernel did, at
        # the hard CPU limit, one second after SIGXCPU was ignored or could not be handled.
        return "cpu"
    return "error"
