"""A pytest plugin that fails the session when tests leave processes, ports or temp files behind.

Enable it with ``-p scaffold_testkit.leakguard`` (scaffold's own suite
loads it from the repository's root ``conftest.py``, for the core and every
plugin). At the end of the test session it checks, and fails the session if any is found:

* **processes**: every process started during the session inherits the
  ``SCAFFOLD_TEST_SESSION`` marker in its environment; any still alive (after
  a short grace period) is reported by pid and command line, then killed;
* **ports**: listening sockets opened by the pytest process and not closed (under pytest-xdist, by
  each worker: a worker reports its own to the controller);
* **temp files**: everything tests create through ``tempfile`` goes to a
  session temp dir (``TMPDIR`` is pointed there); anything left in it, apart
  from pytest's own ``tmp_path`` folders, is reported and removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

MARKER_ENV = "SCAFFOLD_TEST_SESSION"
#: Third-party caches that live in the temp dir and persist by design (not a test's leftovers).
PERSISTENT_CACHES = ("torchinductor_",)
#: Helper processes that live exactly as long as the test process by design (they exit with it).
PROCESS_LIFETIME_HELPERS = ("multiprocessing.resource_tracker",)
GRACE_S = 10.0
#: seconds the guard waits for the session's processes to exit before it reports them (default GRACE_S)
GRACE_ENV = "SCAFFOLD_LEAKGUARD_GRACE_S"
_state: dict = {}
_worker_state: dict = {}
#: the key of a pytest-xdist worker's output that carries what it left behind to the controller
WORKER_OUTPUT_KEY = "scaffold_leaks"


def _listening_inodes() -> set[str]:
    """Inodes of sockets in LISTEN state held by this process."""
    listening: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A":
                listening.add(parts[9])
    mine: set[str] = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return mine
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inode = target[8:-1]
            if inode in listening:
                mine.add(inode)
    return mine


def _marked_processes(marker: bytes) -> dict[int, str]:
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if marker not in Path(f"/proc/{entry}/environ").read_bytes():
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue  # exited, waiting to be reaped: not running
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(helper in cmd for helper in PROCESS_LIFETIME_HELPERS):
            continue
        found[int(entry)] = cmd.strip()[:200]
    return found


def pytest_configure(config: pytest.Config) -> None:
    if not Path("/proc/self/environ").exists():
        return
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its own sockets; the rest is the controller's
        _worker_state.update(sockets=_listening_inodes())
        return
    marker = f"{uuid.uuid4().hex}"
    os.environ[MARKER_ENV] = marker
    session_tmp = tempfile.mkdtemp(prefix="scaffold-tests-")
    os.environ["TMPDIR"] = session_tmp
    tempfile.tempdir = None  # recompute gettempdir() from TMPDIR
    _state.update(marker=marker.encode(), tmp=Path(session_tmp), sockets=_listening_inodes())


def _left_open(before: set[str], who: str) -> list[str]:
    return [f"listening socket (inode {inode}) left open by {who}" for inode in sorted(_listening_inodes() - before)]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, on the controller: gather what a worker left behind."""
    _state.setdefault("from_workers", []).extend(getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY, []))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _worker_state:
        name = getattr(session.config, "workerinput", {}).get("workerid", "a worker")
        output = session.config.workeroutput  # type: ignore[attr-defined]  # set by pytest-xdist on a worker
        output[WORKER_OUTPUT_KEY] = _left_open(_worker_state["sockets"], f"test worker {name}")
        return
    if not _state:
        return
    problems: list[str] = list(_state.get("from_workers", []))
    deadline = time.monotonic() + float(os.environ.get(GRACE_ENV) or GRACE_S)
    alive = _marked_processes(_state["marker"])
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = _marked_processes(_state["marker"])
    for pid, cmd in alive.items():
        problems.append(f"process {pid} still running: {cmd}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    problems.extend(_left_open(_state["sockets"], "the test process"))
    leftovers = [p for p in _state["tmp"].iterdir()
                 if not p.name.startswith("pytest-of-") and not p.name.startswith(PERSISTENT_CACHES)]
    for path in leftovers:
        problems.append(f"temp file left behind: {path.name}")
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    _state["problems"] = problems
    if session.exitstatus == 0 and not problems:
        shutil.rmtree(_state["tmp"], ignore_errors=True)  # kept after a failure, to inspect tmp_path
    if problems and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    problems = _state.get("problems")
    if problems:
        terminalreporter.section("left behind by the tests", sep="!", red=True)
        for line in problems:
            terminalreporter.line(line, red=True)
