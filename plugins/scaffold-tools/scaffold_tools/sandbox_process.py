"""Starting the python tool's child process and watching it from the event loop.

* The child is started from a thread that first joins a fresh, empty session keyring (a kernel keyring
  is not covered by any namespace: a child would otherwise share scaffold's session keyring, which may link
  the user's keys). Only that thread's credentials change; scaffold's other threads keep their keyring.
* It starts in a new session (its own process group), with stdin from ``/dev/null`` and the descriptors in
  ``pass_fds`` kept open.
* The event loop reads its stdout and stderr and learns of its exit through a pidfd, so nothing waits in
  a thread and no child watcher is involved; :meth:`Child.close` always kills its group and reaps it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import os
import platform
import signal
import subprocess
import threading

#: ``keyctl``'s system call number per machine (the C library has no wrapper; libkeyutils does, but it is
#: not everywhere).
KEYCTL = {"x86_64": 250, "aarch64": 219, "arm64": 219, "riscv64": 219, "loongarch64": 219, "i386": 288,
          "i686": 288, "armv7l": 311, "armv6l": 311, "ppc64le": 271, "ppc64": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1
READ_CHUNK = 1 << 16

_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


class KeyringError(OSError):
    """The kernel would not give the spawning thread a new session keyring."""


def keyring_supported() -> bool:
    """Whether this machine's ``keyctl`` system call number is known."""
    return platform.machine() in KEYCTL


def join_fresh_session_keyring() -> int:
    """Give the calling thread a new, empty, anonymous session keyring; returns its serial number."""
    number = KEYCTL.get(platform.machine())
    if number is None:
        raise KeyringError(0, f"the keyctl system call of {platform.machine()} is not known to scaffold")
    libc = ctypes.CDLL(None, use_errno=True)
    serial = libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None)
    if serial < 0:
        code = ctypes.get_errno()
        raise KeyringError(code, f"cannot make a fresh session keyring: {os.strerror(code)}")
    return int(serial)


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """Threads that only ever start children (their session keyring is replaced at every start)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="scaffold-spawn")
        return _spawner


def _spawn(command: list[str], cwd: str, env: dict[str, str], pass_fds: tuple[int, ...],
           fresh_keyring: bool) -> subprocess.Popen:
    if fresh_keyring:
        join_fresh_session_keyring()
    return subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, pass_fds=pass_fds)


async def connect_reader(loop: asyncio.AbstractEventLoop, pipe, reader: asyncio.StreamReader) -> asyncio.BaseTransport:
    """Feed ``reader`` from the read end ``pipe`` (a file object, which the transport then owns)."""

    def protocol() -> asyncio.StreamReaderProtocol:
        return asyncio.StreamReaderProtocol(reader, loop=loop)

    transport, _ = await loop.connect_read_pipe(protocol, pipe)
    return transport


class Child:
    """A started child: its output streams and its exit, on the event loop."""

    def __init__(self, popen: subprocess.Popen, loop: asyncio.AbstractEventLoop):
        self.popen = popen
        self.pid = popen.pid
        self.loop = loop
        self.exited = asyncio.Event()
        self.stdout = asyncio.StreamReader(limit=READ_CHUNK, loop=loop)
        self.stderr = asyncio.StreamReader(limit=READ_CHUNK, loop=loop)
        self._transports: list[asyncio.BaseTransport] = []
        # Our own child, not yet reaped: its pid cannot have been reused.
        self.pidfd = os.pidfd_open(popen.pid)
        loop.add_reader(self.pidfd, self._on_exit)

    def _on_exit(self) -> None:
        self.loop.remove_reader(self.pidfd)
        self.exited.set()

    async def connect(self) -> None:
        for pipe, reader in ((self.popen.stdout, self.stdout), (self.popen.stderr, self.stderr)):
            self._transports.append(await connect_reader(self.loop, pipe, reader))

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.exited.is_set() else self.popen.returncode

    def kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)  # it leads its own session, so its pgid is its pid
        except (ProcessLookupError, PermissionError):
            pass

    async def close(self) -> None:
        """Kill the group, reap the child (bounded) and release its descriptors."""
        self.kill_group()
        try:
            await asyncio.wait_for(self.exited.wait(), timeout=10)
        except BaseException:  # cancelled again or stuck: the kernel still reaps it below or at our exit
            pass
        try:
            self.loop.remove_reader(self.pidfd)
        finally:
            os.close(self.pidfd)
            self.popen.poll()
            for transport in self._transports:
                transport.close()
            for pipe in (self.popen.stdout, self.popen.stderr):
                if pipe is not None and not self._transports:
                    pipe.close()


def _abandon(spawned: asyncio.Future) -> None:
    """Kill and reap a child whose caller was cancelled while it was being started."""
    if spawned.cancelled() or spawned.exception() is not None:
        return
    popen = spawned.result()
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pipe in (popen.stdout, popen.stderr):
        if pipe is not None:
            pipe.close()
    threading.Thread(target=popen.wait, name="scaffold-reap", daemon=True).start()


async def start_child(command: list[str], cwd: str, env: dict[str, str], pass_fds: tuple[int, ...] = (),
                      *, fresh_keyring: bool = True) -> Child:
    """Start ``command`` (see the module's doc) and return it, its output connected to the event loop."""
    loop = asyncio.get_running_loop()
    spawned = loop.run_in_executor(_executor(), _spawn, command, cwd, env, pass_fds, fresh_keyring)
    try:
        popen = await asyncio.shield(spawned)
    except asyncio.CancelledError:
        spawned.add_done_callback(_abandon)  # the thread may still start it: kill it then
        raise
    child = Child(popen, loop)
    try:
        await child.connect()
    except BaseException:
        await child.close()
        raise
    return child
