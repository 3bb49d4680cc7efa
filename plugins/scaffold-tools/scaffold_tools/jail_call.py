"""One program's run in the jail: what bubblewrap is handed, and the jail's first process held, confined,
let go and ended.

1. The descriptors (:class:`~scaffold_tools.jail.JailFds`): the program and the system-call filter in memory
   files, a status pipe bubblewrap writes to, and a pipe the jail's first process waits on before it starts
   the program (``--block-fd``). The call's control group, when there is one, is made before bubblewrap starts.
2. bubblewrap is started (:func:`scaffold_tools.sandbox_process.start_child`). :meth:`JailCall.admit` reads
   the jail's first process from the status pipe, holds it through a pidfd (its parent must be this call's
   bubblewrap), puts it in the control group, gives it OOM score 1000 (the kernel's first choice when memory
   runs out) and lets it go. Nothing of the program has run before it is confined.
3. :meth:`JailCall.exit_code` reads the program's exit status from the status pipe: bubblewrap writes it only
   when the program was started, so a missing status is a setup failure, whatever the program printed.
4. :meth:`JailCall.end`, in every case (normal exit, timeout, cancellation): SIGKILL to the first process
   through its pidfd — the kernel then ends every process of its PID namespace —, then the control group is
   killed and removed. Nothing the program started outlives the call, even if it left bubblewrap's session
   or would ignore bubblewrap's death.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from .jail import Jail, JailFds
from .jail_cgroup import CallCgroup, Cgroups, JailBudget
from .jail_seccomp import seccomp_program
from .sandbox_process import Child, connect_reader, start_child

#: OOM score of every process of the jail: the kernel's first choice when the machine runs out of memory.
OOM_SCORE_ADJ = 1000
#: Seconds bubblewrap has to report the jail's first process, and to report the program's exit.
STATUS_TIMEOUT_S = 10.0
#: Seconds the jail has to vanish once its first process is killed.
END_TIMEOUT_S = 5.0


def _memory_file(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _parent_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class JailCall:
    """The state of one program's run in the jail (see the module's doc)."""

    def __init__(self, jail: Jail, code: str, config: str, env: dict[str, str], *,
                 cgroups: Cgroups | None = None, budget: JailBudget | None = None,
                 extra_fds: Sequence[int] = ()):
        self.jail = jail
        self._own: list[int] = []  # every descriptor this object opened and must close
        self.cgroup: CallCgroup | None = None
        self.pidfd: int | None = None
        self.init_pid: int | None = None
        self._status: asyncio.StreamReader | None = None
        self._status_transport: asyncio.BaseTransport | None = None
        try:
            code_fd = self._keep(_memory_file("main.py", code.encode("utf-8", errors="replace")))
            seccomp_fd = self._keep(_memory_file("seccomp", seccomp_program()))
            self._status_read, status_write = (self._keep(fd) for fd in os.pipe())
            block_read, self._block_write = (self._keep(fd) for fd in os.pipe())
            self.fds = JailFds(code=code_fd, seccomp=seccomp_fd, status=status_write, block=block_read)
            self.command = jail.command(config, self.fds, env)
            self.pass_fds = (code_fd, seccomp_fd, status_write, block_read, *extra_fds)
            if cgroups is not None and budget is not None:
                self.cgroup = cgroups.make(budget)
        except BaseException:
            self._close_fds()
            raise

    def _keep(self, fd: int) -> int:
        self._own.append(fd)
        return fd

    def _close(self, fd: int) -> None:
        if fd in self._own:
            self._own.remove(fd)
            os.close(fd)

    def _close_fds(self) -> None:
        for fd in self._own:
            try:
                os.close(fd)
            except OSError:
                pass
        self._own.clear()

    async def start(self, env: dict[str, str]) -> Child:
        """Start bubblewrap; the jail's first process then waits for :meth:`admit`."""
        child = await start_child(self.command, "/", env, self.pass_fds)
        # The child has its own copies; ours would keep the status pipe open after bubblewrap exits.
        for fd in (self.fds.code, self.fds.seccomp, self.fds.status, self.fds.block):
            self._close(fd)
        loop = asyncio.get_running_loop()
        self._status = asyncio.StreamReader(loop=loop)
        pipe = os.fdopen(self._status_read, "rb", buffering=0)
        self._own.remove(self._status_read)  # the transport owns it now
        self._status_transport = await connect_reader(loop, pipe, self._status)
        return child

    async def _report(self, timeout: float) -> dict | None:
        """The next JSON object bubblewrap wrote on the status pipe (None at its end or after ``timeout``)."""
        assert self._status is not None
        try:
            line = await asyncio.wait_for(self._status.readline(), timeout)
        except asyncio.TimeoutError:
            return None
        if not line:
            return None
        try:
            report = json.loads(line)
        except ValueError:
            return None
        return report if isinstance(report, dict) else None

    async def admit(self, child: Child) -> bool:
        """Hold, confine and let go the jail's first process; False when bubblewrap failed before it could."""
        report = await self._report(STATUS_TIMEOUT_S)
        pid = report.get("child-pid") if report else None
        if not isinstance(pid, int) or pid <= 0:
            return False
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False
        self.pidfd, self.init_pid = pidfd, pid
        if _parent_of(pid) != child.pid:  # gone, and its number taken by another process: not ours to touch
            os.close(pidfd)
            self.pidfd = None
            return False
        try:
            if self.cgroup is not None:
                self.cgroup.attach(pid)
            with open(f"/proc/{pid}/oom_score_adj", "w") as f:
                f.write(str(OOM_SCORE_ADJ))
        except OSError:  # it died in bubblewrap's set-up (its error is on stderr)
            return False
        os.write(self._block_write, b"1")
        self._close(self._block_write)
        return True

    async def exit_code(self) -> int | None:
        """The program's exit status as bubblewrap reports it (128 + N for signal N), once bubblewrap has exited;
        None when the program never started."""
        while True:
            report = await self._report(STATUS_TIMEOUT_S)
            if report is None:
                return None
            code = report.get("exit-code")
            if isinstance(code, int):
                return code

    def oom_kills(self) -> int:
        """Processes of this call the kernel killed for want of memory (0 without a control group)."""
        return self.cgroup.oom_kills() if self.cgroup is not None else 0

    def kill(self) -> None:
        """SIGKILL to the jail's first process (and so to its whole PID namespace) and to its control group."""
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.cgroup is not None:
            self.cgroup.kill()

    async def end(self) -> None:
        """Kill whatever is left of the jail, wait (bounded) for it to be gone, and release everything."""
        try:
            self.kill()
            if self.pidfd is not None:
                await _gone(self.pidfd, END_TIMEOUT_S)
            if self.cgroup is not None:
                await asyncio.to_thread(self.cgroup.remove)
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None
            if self._status_transport is not None:
                self._status_transport.close()
            self._close_fds()


async def _gone(pidfd: int, timeout: float) -> None:
    """Wait until the process behind ``pidfd`` has exited (a pidfd polls readable then)."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_reader(pidfd, done.set)
    try:
        await asyncio.wait_for(done.wait(), timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        loop.remove_reader(pidfd)
