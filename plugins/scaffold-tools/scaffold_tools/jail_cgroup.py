"""Limits on the whole jail: a control group per call, where the host lets scaffold make one.

Resource limits (``setrlimit``) hold per process: a program may start ``max_processes`` processes of
``memory_mb`` each, so they cannot cap what the jail uses in all. A control group can: every process of the
call is put in one before the program starts (the jail's first process waits on bubblewrap's ``--block-fd``
until it is in), and the kernel then counts memory (memory files, shared memory and the work directory's
tmpfs pages included), processes and CPU time of the whole jail, and OOM-kills inside the group when it is
over its memory, never the trainer beside it.

:func:`find_cgroups` looks for a place to make them, once per tool:

* **cgroup v2** (the unified hierarchy, every current distribution): the process's own cgroup, when its
  ``memory`` and ``pids`` controllers are available and the folder is writable (root, or a cgroup delegated
  to the user: ``systemd-run --user --scope -p Delegate=yes scaffold run ...``). The kernel forbids
  processes in a cgroup whose controllers are enabled for its children, so when scaffold is the only
  process there it first moves itself into a leaf beside the calls' groups (``scaffold-main``), as systemd
  asks of delegated processes; a cgroup shared with other processes is left alone;
* **cgroup v1** (older hosts, and hosts that mount v2 without controllers): the process's own cgroup in the
  ``memory`` hierarchy (required) and in ``pids`` and ``cpu`` where those are writable too.

Where neither is usable, the python tool falls back to resource limits on every process of the jail (its
first process included) and an OOM score of 1000, so that the kernel kills the jail's processes first.
Which of the two is in force is logged when the tool starts and shown by ``scaffold list-plugins``.

A call's group is named ``scaffold-jail-<pid>-<n>`` after the scaffold process that made it; groups left by
a process that no longer runs (killed with SIGKILL mid-call) are emptied and removed the next time a tool
looks for its place.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "scaffold-jail-"
#: The leaf a scaffold process moves itself into under cgroup v2 (see the module's doc).
SELF_LEAF = "scaffold-main"
#: CPU bandwidth period, microseconds (the kernel's default).
CPU_PERIOD_US = 100_000
_counter = itertools.count()


@dataclass(frozen=True)
class JailBudget:
    """What the whole jail of one call may use."""

    memory_bytes: int
    #: Tasks (processes and threads) at once.
    pids: int
    #: CPU bandwidth, in cores.
    cpus: float


def _read(path: Path) -> str:
    return path.read_text()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, file system type, super options) of each cgroup mount."""
    found: list[tuple[str, str, str, set[str]]] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            found.append((fields[4].replace("\\040", " "), fields[3], rest[0], set(rest[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup per controller (``""`` for the unified hierarchy)."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _folder(mount: str, root: str, path: str) -> Path | None:
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        return None
    inside = path[len(root):] if root != "/" else path
    return Path(mount + "/" + inside.lstrip("/")).resolve() if inside.strip("/") else Path(mount)


@dataclass
class Cgroups:
    """Where calls' groups are made: controller -> parent folder (``unified`` for cgroup v2)."""

    version: int
    parents: dict[str, Path]
    cpu: bool = True
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = ", ".join(f"{name} in {path}" for name, path in self.parents.items())
        return f"a cgroup v{self.version} per call ({where})"

    def make(self, budget: JailBudget) -> CallCgroup:
        """A new group for one call, with ``budget`` set; raises OSError when the kernel refuses."""
        name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        group = CallCgroup(self.version, {c: parent / name for c, parent in self.parents.items()})
        try:
            for folder in group.folders.values():
                folder.mkdir(mode=0o755)
            group.limit(budget, cpu=self.cpu)
        except BaseException:
            group.remove(wait_s=0.0)
            raise
        return group

    def prune(self) -> None:
        """Empty and remove the groups of scaffold processes that are gone."""
        for parent in self.parents.values():
            try:
                entries = list(parent.glob(f"{PREFIX}*"))
            except OSError:
                continue
            for folder in entries:
                owner = folder.name[len(PREFIX):].split("-", 1)[0]
                if owner.isdigit() and not _alive(int(owner)):
                    stale = CallCgroup(self.version, {"stale": folder})
                    stale.kill()
                    stale.remove(wait_s=1.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class CallCgroup:
    """One call's group (one folder per v1 hierarchy)."""

    version: int
    folders: dict[str, Path]

    def limit(self, budget: JailBudget, *, cpu: bool) -> None:
        quota = f"{max(1000, int(budget.cpus * CPU_PERIOD_US))}"
        if self.version == 2:
            folder = self.folders["unified"]
            _write(folder / "memory.max", str(budget.memory_bytes))
            _optional(folder / "memory.swap.max", "0")
            _write(folder / "pids.max", str(budget.pids))
            if cpu:
                _write(folder / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            return
        memory = self.folders["memory"]
        _write(memory / "memory.limit_in_bytes", str(budget.memory_bytes))
        _optional(memory / "memory.memsw.limit_in_bytes", str(budget.memory_bytes))
        if "pids" in self.folders:
            _write(self.folders["pids"] / "pids.max", str(budget.pids))
        if "cpu" in self.folders:
            _write(self.folders["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(self.folders["cpu"] / "cpu.cfs_quota_us", quota)

    def attach(self, pid: int) -> None:
        """Put process ``pid`` (not yet running the program) in the group."""
        for folder in self.folders.values():
            _write(folder / "cgroup.procs", str(pid))

    def oom_kills(self) -> int:
        """Processes the kernel killed in this group for want of memory."""
        folder = self.folders.get("unified") or self.folders.get("memory")
        if folder is None:
            return 0
        source = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in _read(folder / source).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def _pids(self) -> list[int]:
        pids: set[int] = set()
        for folder in self.folders.values():
            try:
                pids.update(int(p) for p in _read(folder / "cgroup.procs").split())
            except (OSError, ValueError):
                continue
        return sorted(pids)

    def kill(self) -> None:
        """SIGKILL everything in the group (``cgroup.kill`` where the kernel has it)."""
        for folder in self.folders.values():
            if self.version == 2 and (folder / "cgroup.kill").exists():
                try:
                    _write(folder / "cgroup.kill", "1")
                    continue
                except OSError:
                    pass
        for pid in self._pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def remove(self, wait_s: float = 2.0) -> bool:
        """Remove the group's folders, waiting up to ``wait_s`` for its last processes to be reaped; returns
        whether they are all gone (a group left behind is removed by the next :meth:`Cgroups.prune`)."""
        deadline = time.monotonic() + wait_s
        pending = [f for f in self.folders.values()]
        while pending:
            for folder in list(pending):
                try:
                    folder.rmdir()
                    pending.remove(folder)
                except FileNotFoundError:
                    pending.remove(folder)
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        pending.remove(folder)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        return not pending


def _optional(path: Path, value: str) -> None:
    """Write a control file the kernel may lack (no swap accounting)."""
    try:
        _write(path, value)
    except OSError:
        pass


def _writable(folder: Path, *files: str) -> bool:
    return os.access(folder, os.W_OK | os.X_OK) and all(os.access(folder / f, os.W_OK) for f in files)


def _v2(mount: str, root: str, path: str, change: bool) -> tuple[Cgroups | None, str]:
    folder = _folder(mount, root, path)
    if folder is None or not folder.is_dir():
        return None, "cgroup v2: this process's cgroup is not under the mount"
    try:
        available = set(_read(folder / "cgroup.controllers").split())
    except OSError as exc:
        return None, f"cgroup v2: {exc.strerror}"
    missing = {"memory", "pids"} - available
    if missing:
        return None, f"cgroup v2: the {' and '.join(sorted(missing))} controller is not available to this process"
    if not _writable(folder, "cgroup.subtree_control", "cgroup.procs"):
        return None, f"cgroup v2: {folder} is not writable by this user (not delegated)"
    wanted = ["memory", "pids"] + (["cpu"] if "cpu" in available else [])
    enable = " ".join(f"+{c}" for c in wanted)
    if not change:
        return Cgroups(2, {"unified": folder}, cpu="cpu" in wanted), ""
    try:
        if set(wanted) - set(_read(folder / "cgroup.subtree_control").split()):
            try:
                _write(folder / "cgroup.subtree_control", enable)
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                procs = _read(folder / "cgroup.procs").split()
                if procs != [str(os.getpid())]:
                    return None, (f"cgroup v2: {folder} holds other processes too (run scaffold in a cgroup of its "
                                  "own, e.g. systemd-run --user --scope -p Delegate=yes)")
                leaf = folder / SELF_LEAF
                leaf.mkdir(mode=0o755, exist_ok=True)
                _write(leaf / "cgroup.procs", str(os.getpid()))
                _write(folder / "cgroup.subtree_control", enable)
    except OSError as exc:
        return None, f"cgroup v2: {folder}: {exc.strerror or exc}"
    return Cgroups(2, {"unified": folder}, cpu="cpu" in wanted), ""


def _v1(mounts: list[tuple[str, str, str, set[str]]], paths: dict[str, str]) -> tuple[Cgroups | None, str]:
    parents: dict[str, Path] = {}
    for controller in ("memory", "pids", "cpu"):
        for mount, root, kind, options in mounts:
            if kind == "cgroup" and controller in options and controller in paths:
                folder = _folder(mount, root, paths[controller])
                if folder is not None and folder.is_dir() and _writable(folder):
                    parents[controller] = folder
                break
    if "memory" not in parents:
        return None, "cgroup v1: the memory hierarchy is not mounted or not writable by this user"
    return Cgroups(1, parents, cpu="cpu" in parents), ""


def find_cgroups(change: bool = True) -> tuple[Cgroups | None, str]:
    """Where this process can make a cgroup per call, or None and why not. With ``change`` false nothing is
    changed on the machine (no controller enabled, no process moved, no stale group removed): only said."""
    mounts, paths = _mounts(), _own_paths()
    reasons = []
    for mount, root, kind, _options in mounts:
        if kind == "cgroup2" and "" in paths:
            found, why = _v2(mount, root, paths[""], change)
            if found is not None:
                if change:
                    found.prune()
                return found, ""
            reasons.append(why)
            break
    if any(kind == "cgroup" for _m, _r, kind, _o in mounts):
        found, why = _v1(mounts, paths)
        if found is not None:
            if change:
                found.prune()
            return found, ""
        reasons.append(why)
    if not mounts:
        reasons.append("no cgroup file system is mounted")
    return None, "; ".join(reasons)
