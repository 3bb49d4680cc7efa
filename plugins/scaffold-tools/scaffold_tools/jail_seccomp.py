"""The python tool's system-call filter: what a program in the jail may not ask the kernel for.

bubblewrap loads a seccomp program from a file descriptor (``--seccomp FD``) and applies it to the program
(the jail's first process) just before it starts; every process the program starts inherits it. The program
is built here with libseccomp (the library Docker, systemd and Flatpak use), through its Python bindings:
the official ``seccomp`` module where it is installed, else ``pyseccomp`` (the same API over ctypes, from
PyPI). It is built once per process and kept as bytes.

Everything is allowed but what an unprivileged program in the jail never needs and what widens the kernel
boundary or escapes the jail's accounting (:data:`DENIED`, EPERM): tracing and writing other processes'
memory, kernel keyrings (no namespace covers them), performance counters, eBPF, userfaultfd and io_uring
(large attack surfaces; io_uring would also get around the socket rule), every mount-family call and new
namespaces, memory that no per-process limit counts (memory files, System V shared memory, message queues
and semaphores, POSIX message queues), inotify (a program could watch other calls' reads of the shared
runtime), and what only a privileged process could do anyway. ``socket`` and ``socketpair`` are refused
(EAFNOSUPPORT) for every address family but ``AF_UNIX`` (:data:`ALLOWED_FAMILY`): no ``AF_VSOCK`` to the
hypervisor, no netlink, packet or crypto sockets, which the network namespace alone does not cover.
``clone`` with a namespace flag is refused, and so is ``prctl(PR_SET_PDEATHSIG)`` (the jail must die with
its bubblewrap monitor, which dies with scaffold); ``clone3`` answers ENOSYS so that the C library falls
back to ``clone``, whose flags the filter can read. System calls of another architecture's ABI (x32, ia32)
kill the process.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
from typing import Any

#: System calls refused with EPERM.
DENIED = (
    # other processes' memory and descriptors (the jail's init is a process of the same user)
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd",
    # kernel keyrings
    "keyctl", "add_key", "request_key",
    # large kernel attack surfaces
    "perf_event_open", "bpf", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    # mounts and namespaces
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "unshare", "setns",
    # memory that no per-process limit counts
    "memfd_create", "memfd_secret", "shmget", "msgget", "semget", "mq_open",
    # watching the reads of other calls (the runtime's files are shared)
    "inotify_init", "inotify_init1", "fanotify_init",
    # privileged anyway: refused before the kernel looks further
    "acct", "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "iopl", "ioperm", "syslog", "quotactl", "quotactl_fd", "nfsservctl", "lookup_dcookie",
    "name_to_handle_at", "open_by_handle_at", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname", "vhangup", "uselib", "ustat", "sysfs", "_sysctl", "create_module",
    "get_kernel_syms", "query_module", "vm86", "vm86old",
)
#: The one address family ``socket`` and ``socketpair`` may use: the jail has no network, and local sockets
#: (what asyncio's event loop makes to wake itself) reach nothing outside it.
ALLOWED_FAMILY = socket.AF_UNIX
#: ``prctl`` operations refused: clearing the parent-death signal bubblewrap sets (the jail would then outlive
#: its monitor if scaffold itself were killed).
PR_SET_PDEATHSIG = 1
#: ``clone`` flags that make new namespaces (refused even where the kernel would refuse them too).
NAMESPACE_FLAGS = (0x00000080, 0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)


class SeccompUnavailable(RuntimeError):
    """libseccomp or its Python bindings are missing; the message says how to get them."""


INSTALL_HINT = ("install libseccomp (Debian/Ubuntu: apt-get install libseccomp2; Fedora: dnf install libseccomp) "
                "and its Python bindings (pip install pyseccomp, which scaffold-tools depends on)")


def _bindings() -> Any:
    try:
        import seccomp  # libseccomp's own bindings, where the OS ships them

        return seccomp
    except ImportError:
        pass
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:  # OSError: the bindings are there, the library is not
        raise SeccompUnavailable(f"python tool: the system-call filter cannot be built ({exc}); {INSTALL_HINT}, "
                                 "or set isolation: none to run programs without kernel isolation (unsafe for "
                                 "untrusted code)") from None
    return pyseccomp


def _known(sc: Any, name: str) -> bool:
    """Whether ``name`` is a real system call of this architecture (not one libseccomp emulates)."""
    try:
        return int(sc.resolve_syscall(sc.Arch.NATIVE if hasattr(sc, "Arch") else 0, name)) >= 0
    except Exception:  # an unknown name: some bindings raise instead of returning a negative number
        return False


def _build() -> bytes:
    sc = _bindings()
    try:
        program = sc.SyscallFilter(sc.ALLOW)
        # Another ABI's system calls (x32, ia32 on x86_64) would bypass the rules below.
        program.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
        deny = sc.ERRNO(errno.EPERM)
        for name in DENIED:
            if _known(sc, name):
                program.add_rule(deny, name)
        for call in ("socket", "socketpair"):
            program.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), call, sc.Arg(0, sc.NE, ALLOWED_FAMILY))
        program.add_rule(deny, "prctl", sc.Arg(0, sc.EQ, PR_SET_PDEATHSIG))
        for flag in NAMESPACE_FLAGS:
            program.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        if _known(sc, "clone3"):
            program.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        read, write = os.pipe()
        with os.fdopen(read, "rb") as source:
            with os.fdopen(write, "wb") as sink:
                program.export_bpf(sink)
            return source.read()
    except Exception as exc:
        raise SeccompUnavailable(f"python tool: libseccomp could not build the system-call filter "
                                 f"({type(exc).__name__}: {exc}); {INSTALL_HINT}") from None


@functools.cache
def seccomp_program() -> bytes:
    """The filter as a BPF program, the bytes ``bwrap --seccomp`` reads; raises :class:`SeccompUnavailable`."""
    return _build()
