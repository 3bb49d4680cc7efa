"""The python tool's jail: each program runs under bubblewrap (``bwrap``), the sandbox Flatpak uses.

:meth:`Jail.command` is the ``bwrap`` command line of one call:

* fresh user, PID, mount, network, IPC and UTS namespaces (``--unshare-all --unshare-user``), no
  further user namespaces inside (``--disable-userns``), every capability dropped, a new session
  (no controlling terminal to push input into);
* the program is the PID namespace's first process (``--as-pid-1``): there is no bubblewrap init beside it
  to take over, every process of the jail descends from the program and inherits the limits its boot file
  sets, and when it ends, the kernel ends everything else in the namespace. bubblewrap reports the jail's
  first process on a status channel (``--json-status-fd``: its host PID, then the program's exit status,
  which is written only once the program was started, so a setup failure is told from the program's own by
  that channel, never by what was printed) and holds it (``--block-fd``) until the parent has put it in its
  control group and raised its OOM score (:mod:`scaffold_tools.jail_call`);
* a system-call filter (``--seccomp``, :mod:`scaffold_tools.jail_seccomp`) on the jail's every process;
* inside, the program runs as uid/gid 65534. Started by root, the jail is entered as host uid 65534
  too (through ``setpriv``), so that ``RLIMIT_NPROC`` binds: the kernel never applies it to host root,
  whatever the uid inside a user namespace says;
* an empty environment but ``PATH``, ``HOME``, ``TMPDIR`` and the locale (nothing of scaffold's);
* a root file system holding only the jail root (:mod:`scaffold_tools.jail_root`: copies of the interpreter,
  its standard library and the shared libraries they load) and the allowed site-packages, all read-only, a
  fresh ``/proc`` of the jail's own PID namespace, read-only too (no process may write another's memory
  through ``/proc/<pid>/mem``) with the kernel keyring listings masked, and a minimal ``/dev``; nothing of the
  project, the run directory, the data or any home folder;
* the work directory, ``/sandbox``, a private tmpfs capped at ``workdir_mb`` (``--size``, bubblewrap
  0.8.0 or later): the cap is on the total of every file the program writes; ``/tmp`` points to it.

:func:`check_bwrap` and :func:`check_setpriv` say why the jail cannot run here (no bwrap, one too old, no
setpriv); the tool's ``start()`` also runs one program in it, which fails where user namespaces are disabled.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from .jail_root import BOOT_PATH, JailRoot

#: The uid and gid programs run as inside the jail (and, when scaffold runs as root, outside it).
JAIL_UID = 65534
#: The program's working directory (and HOME, TMPDIR) inside the jail.
WORKDIR = "/sandbox"
#: The first bubblewrap that can cap a tmpfs's size (``--size``).
MIN_BWRAP = (0, 8, 0)
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
                "`make setup` installs it when run as root)")
NO_ISOLATION_HINT = "or set isolation: none to run programs without kernel isolation (unsafe for untrusted code)"
USERNS_HINT = ("enable unprivileged user namespaces (sysctl user.max_user_namespaces=15000; on Debian before 11 "
               "kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 and later "
               "kernel.apparmor_restrict_unprivileged_userns=0), or run scaffold outside a container that forbids them")


class JailUnavailable(RuntimeError):
    """bubblewrap cannot run programs here; the message says how to fix it."""


@functools.cache
def bwrap_version(bwrap: str) -> tuple[int, ...] | None:
    """``bwrap --version`` as numbers (None when it does not say)."""
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(n or 0) for n in found.groups()) if found else None


def check_bwrap(bwrap: str | None = None) -> str:
    """The path of a usable ``bwrap``; raises :class:`JailUnavailable` saying how to get one."""
    path = bwrap or shutil.which("bwrap")
    if path is None or not os.access(path, os.X_OK):
        raise JailUnavailable(f"python tool: bubblewrap (bwrap) is not installed, so programs cannot run in a kernel "
                              f"jail; {INSTALL_HINT}, {NO_ISOLATION_HINT}")
    version = bwrap_version(path)
    if version is None or version < MIN_BWRAP:
        shown = ".".join(map(str, version)) if version else "of unknown version"
        raise JailUnavailable(f"python tool: bubblewrap {shown} ({path}) cannot cap the work directory's size "
                              f"(--size needs bubblewrap {'.'.join(map(str, MIN_BWRAP))} or later); upgrade it, "
                              f"{NO_ISOLATION_HINT}")
    return path


def check_setpriv() -> str | None:
    """The ``setpriv`` that enters the jail as an unprivileged user when scaffold runs as root (None when it does
    not); raises :class:`JailUnavailable` saying how to get it."""
    if host_uid() is None:
        return None
    path = shutil.which("setpriv")
    if path is None:
        raise JailUnavailable("python tool: setpriv is not installed; scaffold runs as root, and the jail is entered "
                              "through setpriv as an unprivileged user (uid 65534) so that the kernel applies the "
                              "process limit; install util-linux (Debian/Ubuntu: apt-get install util-linux), "
                              f"run scaffold as an ordinary user, {NO_ISOLATION_HINT}")
    return path


def host_uid() -> int | None:
    """The host uid the jail is entered as: 65534 when scaffold runs as root, else None (scaffold's own)."""
    return JAIL_UID if os.geteuid() == 0 else None


#: Files of the jail's ``/proc`` hidden behind an unreadable node: the kernel keyrings its user can see.
MASKED_PROC = ("/proc/keys", "/proc/key-users")


@dataclass(frozen=True)
class JailFds:
    """The descriptors bubblewrap is handed for one call (numbers as the child sees them)."""

    #: The program's source, copied to ``/sandbox/main.py``.
    code: int
    #: The system-call filter (BPF), which bubblewrap reads and applies.
    seccomp: int
    #: Where bubblewrap writes the jail's first process (JSON) and, once it ran, the program's exit status.
    status: int
    #: What the jail's first process waits on before it starts the program.
    block: int


@dataclass(frozen=True)
class Jail:
    """How to start one program in a bubblewrap jail over ``root``."""

    bwrap: str
    root: JailRoot
    workdir_bytes: int
    #: ``setpriv``, when scaffold runs as root (:func:`check_setpriv`).
    setpriv: str | None = None

    def _binds(self) -> list[str]:
        args: list[str] = []
        names = set()
        for name, link in self.root.entries():
            names.add(name)
            if link is None:
                args += ["--ro-bind", str(self.root.path / name), f"/{name}"]
            else:
                args += ["--symlink", link, f"/{name}"]
        for folder in self.root.bound_site_packages:
            args += ["--ro-bind", folder, folder]
        args += ["--proc", "/proc"]
        for path in MASKED_PROC:
            args += ["--ro-bind", "/dev/null", path]  # a device node on a nodev mount: opening it fails
        args += ["--remount-ro", "/proc", "--dev", "/dev",
                 "--size", str(self.workdir_bytes), "--perms", "0700", "--tmpfs", WORKDIR]
        if "tmp" not in names:
            args += ["--symlink", WORKDIR, "/tmp"]
        return args

    @staticmethod
    def _seal() -> list[str]:
        """Last: the root and ``/dev`` (tmpfs that bubblewrap made, owned by the jail's user) become read-only,
        so the size-capped work directory is the only place a program can write."""
        return ["--remount-ro", "/dev", "--remount-ro", "/"]

    def command(self, config: str, fds: JailFds, env: dict[str, str]) -> list[str]:
        """The command line that runs ``sandbox_boot`` with ``config`` on the program in ``fds.code``."""
        uid = host_uid()
        prefix: list[str] = []
        if uid is not None:
            if self.setpriv is None:
                raise JailUnavailable("python tool: the jail was set up without setpriv, which it needs when "
                                      "scaffold runs as root")
            prefix = [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        setenv = [arg for name, value in env.items() for arg in ("--setenv", name, value)]
        return [
            *prefix, self.bwrap,
            "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--as-pid-1", "--cap-drop", "ALL", "--uid", str(JAIL_UID), "--gid", str(JAIL_UID),
            "--hostname", "sandbox", "--clearenv", *setenv, *self._binds(),
            "--file", str(fds.code), f"{WORKDIR}/main.py", *self._seal(), "--chdir", WORKDIR,
            "--seccomp", str(fds.seccomp), "--json-status-fd", str(fds.status), "--block-fd", str(fds.block),
            "--", self.root.runtime.executable, "-I", "-S", "-B", "-u", "-X", "utf8", BOOT_PATH, config,
        ]


def jail_environment(extra: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    """The program's whole environment inside the jail."""
    return {"PATH": "/usr/bin:/bin", "HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            **dict(extra)}
