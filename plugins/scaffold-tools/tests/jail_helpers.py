"""Helpers of the scaffold-tools tests: the python tool with small limits, started where the jail runs."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from scaffold_core.errors import ConfigError
from scaffold_core.tool import ToolContext, ToolResult, invoke_tool
from scaffold_tools.python_tool import PythonTool

#: Small limits, so that the limit tests are quick.
FAST = {"timeout": 8.0, "cpu_seconds": 3, "memory_mb": 256, "file_mb": 1, "max_output_bytes": 4000}


def require_jail(tool: PythonTool) -> PythonTool:
    """Start ``tool``; where bubblewrap cannot run, skip (fail in CI: ``make setup`` installs it there)."""
    try:
        asyncio.run(tool.start())
    except ConfigError as exc:
        if os.environ.get("CI") or not sys.platform.startswith("linux"):
            raise
        pytest.skip(f"kernel isolation is unavailable here: {exc}")
    return tool


def bubblewrap_or_skip() -> None:
    """Skip (fail in CI) where there is no usable bwrap."""
    from scaffold_tools.jail import JailUnavailable, check_bwrap

    try:
        check_bwrap()
    except JailUnavailable as exc:
        if os.environ.get("CI") or not sys.platform.startswith("linux"):
            raise
        pytest.skip(str(exc))


def run_codes(tool: PythonTool, *codes: str, stagger_s: float = 0.0) -> list[ToolResult]:
    """Run every program concurrently (each ``stagger_s`` after the one before); results in order."""
    async def one(i: int, code: str) -> ToolResult:
        await asyncio.sleep(i * stagger_s)
        return await invoke_tool(tool, {"code": code}, ToolContext("ep", f"call-{i}"))

    async def main() -> list[ToolResult]:
        return list(await asyncio.gather(*(one(i, code) for i, code in enumerate(codes))))

    return asyncio.run(main())


# -- what the attack tests share ---------------------------------------------------------------------------


def marked_processes(marker: str) -> list[tuple[int, int]]:
    """(pid, host uid) of live processes whose environment holds ``marker`` (the jail passes the variable
    SCAFFOLD_TEST_SESSION on to bubblewrap and the program, so a test that sets it to ``marker`` finds them)."""
    from pathlib import Path

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if marker.encode() not in Path(f"/proc/{entry}/environ").read_bytes():
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").split()[:1] != ["Z"]:
            found.append((int(entry), int(fields["Uid"].split()[0])))
    return found


def unhooked(code: str) -> str:
    """A program that runs ``code`` in a fresh interpreter started with ``_posixsubprocess.fork_exec`` (no audit
    event, so the default configuration's hook allows it), which has no audit hook at all: what a hostile
    program does first. The fresh interpreter's output is the program's."""
    return f"""
import _posixsubprocess, os, sys
open("attack.py", "w").write({code!r})
args = [sys.executable, "-I", "-S", "attack.py"]
errpipe_read, errpipe_write = os.pipe()
common = (args, [os.fsencode(sys.executable)], True, (), None, None, -1, -1, -1, 1, -1, 2,
          errpipe_read, errpipe_write, False, False, -1, None, None, None, -1)
try:
    pid = _posixsubprocess.fork_exec(*common, None, False)
except TypeError:
    pid = _posixsubprocess.fork_exec(*common, False)
os.close(errpipe_write)
status = os.waitpid(pid, 0)[1]
print("attack exit", os.waitstatus_to_exitcode(status))
"""


def native_code_kit() -> tuple[bytes, bytes, dict[str, str]] | None:
    """The host's _ctypes extension, the libffi it links and the ctypes package: what a program would bring."""
    import importlib.util
    import subprocess
    from pathlib import Path

    spec = importlib.util.find_spec("_ctypes")
    if spec is None or not spec.origin or not spec.origin.endswith(".so"):
        return None
    ldd = subprocess.run(["ldd", spec.origin], capture_output=True, text=True, timeout=60).stdout
    ffi = [line.split("=>")[1].split()[0] for line in ldd.splitlines() if "libffi" in line and "=>" in line]
    package = Path(importlib.util.find_spec("ctypes").origin).parent
    if not ffi:
        return None
    return (Path(spec.origin).read_bytes(), Path(ffi[0]).read_bytes(),
            {p.name: p.read_text() for p in package.glob("*.py")})


def with_native_code(kit: tuple[bytes, bytes, dict[str, str]], code: str) -> str:
    """``code`` preceded by loading a ctypes the program brought along (``libc`` is then bound): native code in
    the jail, which the jail must hold against without the audit hook's help."""
    import base64

    so, ffi, package = kit
    return f"""
import base64, importlib.machinery, importlib.util, os, sys
def _load(name, path):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
open("libffi.so.8", "wb").write(base64.b64decode({base64.b64encode(ffi).decode()!r}))
open("_ctypes.so", "wb").write(base64.b64decode({base64.b64encode(so).decode()!r}))
sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)
try:
    _load("json.libffi", "/sandbox/libffi.so.8")  # no init function, but the library stays loaded
except ImportError:
    pass
sys.modules["_ctypes"] = _load("json._ctypes", "/sandbox/_ctypes.so")
os.makedirs("ctypes", exist_ok=True)
for _name, _text in {package!r}.items():
    open("ctypes/" + _name, "w").write(_text)
sys.path.insert(0, "/sandbox")
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
""" + code


#: System call numbers the attacks use, per machine (the C library has no wrapper for most of them).
SYSCALLS = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
               "keyctl": 250, "add_key": 248, "request_key": 249, "perf_event_open": 298, "bpf": 321,
               "userfaultfd": 323, "io_uring_setup": 425, "mount": 165, "umount2": 166, "pivot_root": 155,
               "unshare": 272, "setns": 308, "memfd_create": 319, "shmget": 29, "msgget": 68, "semget": 64,
               "inotify_init1": 294, "fanotify_init": 300, "prctl": 157, "clone3": 435, "open_tree": 428,
               "fsopen": 430, "mq_open": 240, "shmat": 30},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
                "keyctl": 219, "add_key": 217, "request_key": 218, "perf_event_open": 241, "bpf": 280,
                "userfaultfd": 282, "io_uring_setup": 425, "mount": 40, "umount2": 39, "pivot_root": 41,
                "unshare": 97, "setns": 268, "memfd_create": 279, "shmget": 194, "msgget": 186, "semget": 190,
                "inotify_init1": 26, "fanotify_init": 262, "prctl": 167, "clone3": 435, "open_tree": 428,
                "fsopen": 430, "mq_open": 180, "shmat": 196},
}


def syscall_numbers() -> dict[str, int]:
    """This machine's numbers (skips the test on a machine the table does not know)."""
    import platform

    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        pytest.skip(f"no system call table for {platform.machine()} in these tests")
    return numbers
