"""The python tool's jail against a second round of attacks: taking over the jail's first process, kernel
keyrings, sockets outside the network namespace, memory that no per-process limit counts, and forged or
real set-up failures.

Each attack runs in the default configuration through a fresh interpreter the program starts without an
audit hook (``unhooked``: what a hostile program does first), and with the jail alone (``audit_hook:
false``). Native code comes from a ctypes the program brings along (``with_native_code``). Every test checks
the host side too: nothing of the jail left running, no key planted, the memory actually bounded.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
from jail_helpers import (
    FAST,
    marked_processes,
    native_code_kit,
    require_jail,
    run_codes,
    syscall_numbers,
    unhooked,
    with_native_code,
)

from scaffold_core.errors import ConfigError
from scaffold_tools import jail as jail_module
from scaffold_tools.python_tool import PythonTool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap is Linux's")

REPO = Path(__file__).resolve().parents[3]
BIG = {**FAST, "max_code_bytes": 4_000_000}


@pytest.fixture(scope="module")
def kit():
    found = native_code_kit()
    if found is None:
        pytest.skip("needs the host's _ctypes extension and libffi to bring along")
    return found


@pytest.fixture(scope="module")
def big_default() -> PythonTool:
    return require_jail(PythonTool(**BIG))


@pytest.fixture(scope="module")
def big_jail_only() -> PythonTool:
    return require_jail(PythonTool(audit_hook=False, **BIG))


@pytest.fixture(params=["default", "jail only"])
def attack(request, big_default, big_jail_only):
    """(tool, wrap): run ``wrap(code)`` on ``tool`` to attack in that configuration."""
    if request.param == "default":
        return big_default, unhooked
    return big_jail_only, lambda code: code


def run_one(tool: PythonTool, code: str) -> str:
    result = run_codes(tool, code)[0]
    return result.content


# -- the jail's first process ----------------------------------------------------------------------------------

#: x86-64 code written over the jail's first process: clear its parent-death signal, close its output,
#: tell bubblewrap's monitor "exit 0" on its eventfd (when it has one), then wait forever: a process that
#: outlives the call and the run.
TAKEOVER = r'''
import os, struct
report = []
try:
    pc = int(open("/proc/1/syscall").read().split()[-1], 16)
except OSError as exc:
    pc = None
    report.append(f"syscall refused {exc.errno}")
efd = None
for fd in os.listdir("/proc/1/fd"):
    try:
        if "eventfd" in os.readlink(f"/proc/1/fd/{fd}"):
            efd = int(fd)
    except OSError:
        pass
code = b"\xbf\x01\x00\x00\x00\x31\xf6\xb8\x9d\x00\x00\x00\x0f\x05"
for fd in (0, 1, 2):
    code += b"\xbf" + struct.pack("<I", fd) + b"\xb8\x03\x00\x00\x00\x0f\x05"
if efd is not None:
    code += b"\x6a\x01\x48\x89\xe6\xbf" + struct.pack("<I", efd) + b"\xba\x08\x00\x00\x00\xb8\x01\x00\x00\x00\x0f\x05"
code += b"\xb8\x22\x00\x00\x00\x0f\x05\xeb\xf7"
try:
    with open("/proc/1/mem", "r+b", buffering=0) as mem:
        if pc is not None and os.uname().machine == "x86_64":
            mem.seek(pc)
            mem.write(code)
        report.append("WRITTEN")
except OSError as exc:
    report.append(f"mem refused {exc.errno}")
print(" ".join(report))
'''


def test_the_jails_first_process_cannot_be_taken_over_through_proc_mem(attack, monkeypatch):
    """Writing code into the jail's first process through /proc/1/mem made it outlive the call, unlimited;
    /proc is read-only in the jail, and whatever happens, every process of the jail ends with the call."""
    tool, wrap = attack
    marker = f"marker-{uuid.uuid4().hex}"
    monkeypatch.setenv("SCAFFOLD_TEST_SESSION", marker)
    text = run_one(tool, wrap(TAKEOVER))
    assert "mem refused" in text and "WRITTEN" not in text, text
    assert marked_processes(marker) == [], "the jail outlived the call"


def test_the_jails_first_process_cannot_be_traced_or_written(attack, kit, monkeypatch):
    """ptrace, process_vm_writev and pidfd_getfd on the jail's first process (the program's parent or itself)
    are refused by the system-call filter."""
    tool, wrap = attack
    calls = syscall_numbers()
    marker = f"marker-{uuid.uuid4().hex}"
    monkeypatch.setenv("SCAFFOLD_TEST_SESSION", marker)
    code = with_native_code(kit, f"""
import ctypes
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
print("attach", libc.syscall({calls['ptrace']}, PTRACE_ATTACH, 1, 0, 0), ctypes.get_errno())
print("seize", libc.syscall({calls['ptrace']}, PTRACE_SEIZE, 1, 0, 0), ctypes.get_errno())
buf = ctypes.create_string_buffer(b"x" * 8)
local = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
remote = (ctypes.c_void_p * 2)(0x10000, 8)
print("vm_write", libc.syscall({calls['process_vm_writev']}, 1, local, 1, remote, 1, 0), ctypes.get_errno())
print("vm_read", libc.syscall({calls['process_vm_readv']}, 1, local, 1, remote, 1, 0), ctypes.get_errno())
""")
    text = run_one(tool, wrap(code))
    lines = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.split()[:1] and
             line.split()[0] in ("attach", "seize", "vm_write", "vm_read")}
    assert set(lines) == {"attach", "seize", "vm_write", "vm_read"}, text
    assert all(result == ["-1", "1"] for result in lines.values()), text  # EPERM
    assert marked_processes(marker) == []


def test_the_jails_first_process_has_the_programs_limits(attack):
    """The jail's first process is the program itself (no unlimited init beside it): its limits are the
    call's, so everything in the jail inherits them."""
    tool, wrap = attack
    code = """
limits = {line[:26].strip(): line[26:].split()[:2] for line in open("/proc/1/limits").read().splitlines()[1:]}
print(limits["Max address space"], limits["Max processes"], limits["Max cpu time"])
print(open("/proc/1/oom_score_adj").read().strip())
"""
    lines = run_one(tool, wrap(code)).splitlines()
    memory = str(tool.limits.memory_mb << 20)
    assert lines[0] == str([memory, memory]) + " " + str([str(tool.limits.max_processes)] * 2) + " " + str(
        [str(tool.limits.cpu_seconds), str(tool.limits.cpu_seconds + 1)]), lines
    assert lines[1] == "1000", lines


# -- kernel keyrings ---------------------------------------------------------------------------------------------

KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -3, -4
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_LINK, KEYCTL_SEARCH = 1, 8, 10


def _keys_call(name: str, *args) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(syscall_numbers()[name], *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(result)


def _search(keyring: int, description: bytes) -> int | None:
    try:
        return _keys_call("keyctl", ctypes.c_long(KEYCTL_SEARCH), ctypes.c_long(keyring), b"user", description,
                          ctypes.c_long(0))
    except OSError:
        return None


#: The attack on keyrings: find and read the canary through the session, user and user-session keyrings,
#: plant a key of its own in the session keyring, and list /proc/keys.
KEYRING_ATTACK = """
import ctypes
KEYCTL, ADD_KEY = {keyctl}, {add_key}
for ring, name in ((-3, "session"), (-4, "user"), (-5, "user-session")):
    found = libc.syscall(KEYCTL, 10, ring, b"user", {description!r}, 0)
    print(name, "search", found, ctypes.get_errno())
    if found > 0:
        buf = ctypes.create_string_buffer(512)
        size = libc.syscall(KEYCTL, 11, found, buf, 512)
        print("READ", buf.raw[:max(size, 0)])
print("planted", libc.syscall(ADD_KEY, b"user", {planted!r}, b"evil", 4, -3), ctypes.get_errno())
try:
    print("proc keys", open("/proc/keys").read()[:2000])
except OSError as exc:
    print("proc keys refused", exc.errno)
"""


def _in_thread(target):
    """Run ``target`` in a thread of its own (its keyring changes stay there) and return its result."""
    box: dict = {}

    def body():
        try:
            box["value"] = target()
        except BaseException as exc:  # pragma: no cover - re-raised below
            box["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=300)
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_the_parents_session_keyring_is_out_of_reach(attack, kit):
    """Keyrings belong to no namespace: a jail started from a thread whose session keyring holds a secret
    (an SSH login's, a service's) could read it and plant keys there. Every call gets a fresh, empty session
    keyring, and the system-call filter refuses keyctl, add_key and request_key."""
    tool, wrap = attack
    calls = syscall_numbers()
    secret = f"canary-{uuid.uuid4().hex}".encode()
    description, planted = f"scaffold-canary-{uuid.uuid4().hex}".encode(), f"planted-{uuid.uuid4().hex}".encode()
    code = with_native_code(kit, KEYRING_ATTACK.format(keyctl=calls["keyctl"], add_key=calls["add_key"],
                                                        description=description, planted=planted))

    def scenario():
        _keys_call("keyctl", ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), f"scaffold-test-{uuid.uuid4().hex}".encode())
        _keys_call("add_key", b"user", description, secret, ctypes.c_size_t(len(secret)),
                   ctypes.c_long(KEY_SPEC_SESSION_KEYRING))
        assert _search(KEY_SPEC_SESSION_KEYRING, description) is not None  # the canary is there to be stolen
        text = run_one(tool, wrap(code))
        return text, _search(KEY_SPEC_SESSION_KEYRING, planted)

    text, planted_found = _in_thread(scenario)
    assert secret.decode() not in text and "READ" not in text, text
    assert "planted -1" in text and planted_found is None, text
    assert "proc keys refused" in text, text


def test_concurrent_jails_share_no_keyring(big_jail_only, kit):
    """Two calls at once (as root, both are uid 65534 on the host): what one puts in a keyring, the other
    cannot find — no channel between the rollouts of a group."""
    calls = syscall_numbers()
    description = f"scaffold-shared-{uuid.uuid4().hex}".encode()
    writer = with_native_code(kit, f"""
import ctypes, time
for ring in (-3, -4):
    print("add", libc.syscall({calls['add_key']}, b"user", {description!r}, b"psst", 4, ring), ctypes.get_errno())
time.sleep(2.0)
""")
    reader = with_native_code(kit, f"""
import ctypes, time
time.sleep(0.8)
for ring in (-3, -4, -5):
    print("found", libc.syscall({calls['keyctl']}, 10, ring, b"user", {description!r}, 0), ctypes.get_errno())
""")
    wrote, read = run_codes(big_jail_only, writer, reader)
    assert wrote.content.count("add -1 1") == 2, wrote.content
    assert read.content.count("found -1") == 3, read.content


def _interpreter_for(uid: int) -> str | None:
    """An interpreter of this Python version an ordinary user can run, with its standard library."""
    candidates = [sys.executable, f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"]
    for candidate in candidates:
        real = os.path.realpath(candidate)
        if not os.path.exists(real):
            continue
        probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", real, "-I", "-c",
                                "import os, sys; print('%d.%d' % sys.version_info[:2], os.access(sys.executable, 1))"],
                               capture_output=True, text=True, timeout=60)
        if probe.returncode == 0 and probe.stdout.split() == [f"{sys.version_info[0]}.{sys.version_info[1]}", "True"]:
            return real
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="starts scaffold as another, ordinary user (needs root)")
def test_an_ordinary_users_keyrings_are_out_of_reach(kit):
    """Run by an ordinary user, the jail has that user's host uid: it must not reach the user's keyring (here
    linked into the session keyring, as pam_keyinit does at login), nor plant a key in it."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv")
    uid = 40000 + os.getpid() % 20000
    python = _interpreter_for(uid)
    if python is None:
        pytest.skip("no interpreter of this Python version that an ordinary user can run")
    calls = syscall_numbers()
    home = Path(tempfile.mkdtemp(prefix="scaffold-user-", dir="/tmp"))  # a place the user can reach
    try:
        _as_ordinary_user(kit, calls, uid, python, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _as_ordinary_user(kit, calls: dict[str, int], uid: int, python: str, home: Path) -> None:
    os.chown(home, uid, uid)
    os.chmod(home, 0o700)
    secret = f"canary-{uuid.uuid4().hex}"
    description, planted = f"scaffold-canary-{uuid.uuid4().hex}", f"planted-{uuid.uuid4().hex}"
    attack = with_native_code(kit, KEYRING_ATTACK.format(keyctl=calls["keyctl"], add_key=calls["add_key"],
                                                          description=description.encode(), planted=planted.encode()))
    programs = {"jail only": attack, "default": unhooked(attack)}
    script = home / "user.py"
    script.write_text(f"""
import asyncio, ctypes, json, os
from scaffold_core.tool import ToolContext, invoke_tool
from scaffold_tools.python_tool import PythonTool
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEYCTL, ADD_KEY = {calls['keyctl']}, {calls['add_key']}
assert libc.syscall(KEYCTL, 1, b"scaffold-login") > 0  # a login's session keyring
assert libc.syscall(KEYCTL, 8, ctypes.c_long(-4), ctypes.c_long(-3)) == 0  # with the user keyring linked
secret = {secret.encode()!r}
assert libc.syscall(ADD_KEY, b"user", {description.encode()!r}, secret, len(secret), ctypes.c_long(-4)) > 0
async def main():
    out = {{}}
    for name, code in {programs!r}.items():
        tool = PythonTool(audit_hook=name == "default", max_code_bytes=4_000_000, timeout=20.0)
        await tool.start()
        out[name] = (await invoke_tool(tool, {{"code": code}}, ToolContext("ep", name))).content
    return out
results = asyncio.run(main())
results["planted"] = libc.syscall(KEYCTL, 10, ctypes.c_long(-4), b"user", {planted.encode()!r}, 0)
print(json.dumps(results))
""")
    paths = [str(REPO), str(Path(jail_module.__file__).resolve().parents[1]), sysconfig.get_paths()["purelib"]]
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(paths),
           "SCAFFOLD_CACHE_DIR": str(home / "cache")}
    proc = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, str(script)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in programs:
        text = results[name]
        assert secret not in text and "READ" not in text, text
        assert "planted -1" in text, text
    assert results["planted"] == -1


# -- sockets -------------------------------------------------------------------------------------------------------


def test_only_local_sockets_can_be_made(attack):
    """AF_VSOCK reaches the hypervisor and guest agents from any network namespace; netlink, packet and crypto
    sockets are kernel attack surface. Only AF_UNIX sockets can be made (the jail has no network at all)."""
    tool, wrap = attack
    code = """
import socket
families = {"vsock": (socket.AF_VSOCK, socket.SOCK_STREAM), "netlink": (socket.AF_NETLINK, socket.SOCK_RAW),
            "packet": (getattr(socket, "AF_PACKET", 17), socket.SOCK_RAW), "alg": (getattr(socket, "AF_ALG", 38),
            socket.SOCK_SEQPACKET), "inet": (socket.AF_INET, socket.SOCK_STREAM), "inet6": (socket.AF_INET6,
            socket.SOCK_DGRAM), "unix": (socket.AF_UNIX, socket.SOCK_STREAM)}
for name, (family, kind) in families.items():
    try:
        socket.socket(family, kind).close()
        print(name, "MADE")
    except OSError as exc:
        print(name, "refused", exc.errno)
try:
    socket.socketpair(socket.AF_INET)
    print("pair MADE")
except OSError as exc:
    print("pair refused", exc.errno)
a, b = socket.socketpair()
print("unix pair works", a.send(b"x") == 1 and b.recv(1) == b"x")
"""
    text = run_one(tool, wrap(code))
    for name in ("vsock", "netlink", "packet", "alg", "inet", "inet6", "pair"):
        assert f"{name} refused 97" in text, text  # EAFNOSUPPORT
    assert "unix MADE" in text and "unix pair works True" in text, text


# -- memory --------------------------------------------------------------------------------------------------------


def test_memory_files_and_shared_memory_are_refused(attack, kit):
    """Memory files, System V shared memory and message queues count toward no per-process limit: refused.
    POSIX shared memory has nowhere to go (/dev/shm is read-only)."""
    tool, wrap = attack
    calls = syscall_numbers()
    code = with_native_code(kit, f"""
import ctypes, os
try:
    fd = os.memfd_create("hoard")
    os.ftruncate(fd, 64 << 20)
    os.write(fd, b"x" * (64 << 20))
    print("memfd MADE")
except OSError as exc:
    print("memfd refused", exc.errno)
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
print("shmget", libc.syscall({calls['shmget']}, IPC_PRIVATE, 64 << 20, IPC_CREAT | 0o600), ctypes.get_errno())
print("msgget", libc.syscall({calls['msgget']}, IPC_PRIVATE, IPC_CREAT | 0o600), ctypes.get_errno())
print("semget", libc.syscall({calls['semget']}, IPC_PRIVATE, 8, IPC_CREAT | 0o600), ctypes.get_errno())
try:
    from multiprocessing import shared_memory
    shared_memory.SharedMemory(create=True, size=1 << 20)
    print("posix shm MADE")
except OSError as exc:
    print("posix shm refused", exc.errno)
""")
    text = run_one(tool, wrap(code))
    assert "memfd refused 1" in text, text
    for call in ("shmget", "msgget", "semget"):
        assert f"{call} -1 1" in text, text
    assert "posix shm refused" in text and "MADE" not in text, text


#: Many children, each under the per-process limit, together far over any sensible total.
CHILDREN = """
import os, time
pids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        try:
            hoard = b"x" * ({each} << 20)
            print("child", i, "holds", open("/proc/self/oom_score_adj").read().strip(), flush=True)
            time.sleep(1.5)
            os._exit(0)
        except MemoryError:
            os._exit(3)
    pids.append(pid)
held = 0
for pid in pids:
    status = os.waitpid(pid, 0)[1]
    held += os.waitstatus_to_exitcode(status) == 0
print("held", held)
"""


def test_many_children_cannot_take_the_machines_memory(attack):
    """Each child stays under memory_mb, but together they could take the node (and the OOM killer would pick
    the trainer). With a control group the jail's total is capped (children over it are OOM-killed inside the
    jail); without one, every process of the jail has OOM score 1000, so the kernel picks them first."""
    base, wrap = attack
    tool = require_jail(PythonTool(audit_hook=base.audit_hook, total_memory_mb=384, **BIG))
    text = run_one(tool, wrap(CHILDREN.format(each=150)))
    assert "held" in text, text
    held = int(text.split("held ")[1].split()[0])
    if tool.limits_mode.startswith("a cgroup"):
        assert held <= 2, text  # 4 x 150 MiB > 384 MiB: at least two children were stopped
    else:
        assert held == 4 and text.count("holds 1000") == 4, text


# -- setup failures -----------------------------------------------------------------------------------------------


def test_a_program_cannot_pass_itself_off_as_a_setup_failure(jailed, jail_only):
    """A setup failure says "not the program's fault"; printing bubblewrap's error prefix, or exiting with the
    boot file's setup status, must not make it say so."""
    forgeries = [f"import sys\nsys.stderr.write({line!r})\nsys.exit({status})" for line, status in (
        ("bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n", 1),
        ("setpriv: setresuid failed\n", 1), ("sandbox setup failed: nope\n", 114))]
    for tool in (jailed, jail_only):
        for result in run_codes(tool, *forgeries):
            assert result.metadata["status"] == "error", result
            assert "not the program's fault" not in result.content


class _BrokenJail(jail_module.Jail):
    """A jail whose bubblewrap fails in its set-up: it is asked to bind a folder that does not exist."""

    def command(self, config, fds, env):
        args = super().command(config, fds, env)
        at = args.index("--chdir")
        return args[:at] + ["--ro-bind", f"/nonexistent-{uuid.uuid4().hex}", "/missing"] + args[at:]


def test_a_real_setup_failure_is_reported_as_one(jailed, monkeypatch):
    """bubblewrap failing before the program starts is a setup failure, told by its status channel."""
    real = jailed._jail
    tool = require_jail(PythonTool(**FAST))
    monkeypatch.setattr(tool, "_jail", _BrokenJail(real.bwrap, real.root, real.workdir_bytes, real.setpriv))
    result = run_codes(tool, "print('never')")[0]
    assert result.metadata["status"] == "setup", result
    assert "not the program's fault" in result.content and "never" not in result.content
    assert "nonexistent" in result.content  # bubblewrap's own message


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv is used only when scaffold runs as root")
def test_a_missing_setpriv_refuses_to_start_in_one_line(monkeypatch, tmp_path):
    """As root the jail is entered through setpriv; without it the tool (and `scaffold run`) refuses to start
    with one line saying what to install, never a traceback."""
    real_which = shutil.which
    monkeypatch.setattr(jail_module.shutil, "which",
                        lambda name, *a, **k: None if name == "setpriv" else real_which(name, *a, **k))
    with pytest.raises(ConfigError) as info:
        asyncio.run(PythonTool(**FAST).start())
    message = str(info.value)
    assert "setpriv" in message and "util-linux" in message and "\n" not in message

    scaffold = Path(sys.executable).with_name("scaffold")
    if not scaffold.exists() or "agent" not in subprocess.run([str(scaffold), "list-plugins"], capture_output=True,
                                                                 text=True, timeout=120).stdout:
        pytest.skip("needs the scaffold command and the agent controller (scaffold-multiturn)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bwrap", "ldd"):
        found = real_which(name)
        if found:
            (bin_dir / name).symlink_to(found)
    canned = json.dumps('<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>')
    proc = subprocess.run(
        [str(scaffold), "run", str(REPO / "examples" / "dataset-jsonl.yaml"), "--set", "engine.name=benchmark_canned",
         "--set", f"engine.response={canned}", "--set", "controller.name=agent", "--set", 'controller.tools=["python"]',
         "--set", f"output.dir={tmp_path / 'run'}", "--set", "rollout.progress=false"],
        cwd=REPO, env={**os.environ, "PATH": str(bin_dir)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "setpriv" in errors[0], proc.stderr


# -- the system-call filter, call by call ---------------------------------------------------------------------------


def test_the_system_call_filter_refuses_what_widens_the_boundary(attack, kit):
    """Each refused call, made directly: EPERM (clone3: ENOSYS, so the C library falls back to clone)."""
    tool, wrap = attack
    calls = syscall_numbers()
    probes = {"ptrace": (16, 1, 0, 0), "kcmp": (1, 1, 0, 0, 0), "pidfd_getfd": (0, 0, 0), "keyctl": (0, -3, 0),
              "request_key": (0, 0, 0, 0), "perf_event_open": (0, 0, -1, -1, 0), "bpf": (0, 0, 0),
              "userfaultfd": (0,), "io_uring_setup": (1, 0), "mount": (0, 0, 0, 0, 0), "umount2": (0, 0),
              "pivot_root": (0, 0), "unshare": (0x00020000,), "setns": (0, 0), "open_tree": (-100, 0, 0),
              "fsopen": (0, 0), "inotify_init1": (0,), "fanotify_init": (0, 0), "mq_open": (0, 0, 0, 0),
              "prctl": (1, 0, 0, 0, 0)}
    code = with_native_code(kit, f"""
import ctypes
for name, number, args in {[(n, calls[n], a) for n, a in probes.items()]!r}:
    print(name, libc.syscall(number, *[ctypes.c_long(a) for a in args]), ctypes.get_errno())
print("clone3", libc.syscall({calls['clone3']}, 0, 0), ctypes.get_errno())
""")
    text = run_one(tool, wrap(code))
    results = {line.split()[0]: line.split()[1:] for line in text.splitlines() if len(line.split()) == 3}
    for name in probes:
        assert results.get(name) == ["-1", "1"], (name, text)
    assert results.get("clone3") == ["-1", "38"], text


def test_the_filter_leaves_ordinary_programs_alone(jailed):
    """Threads, processes (where the hook allows them), pipes, local sockets, asyncio, select, mmap and
    multiprocessing's pieces keep working under the filter."""
    code = """
import asyncio, mmap, os, select, socket, threading, json
out = []
t = threading.Thread(target=lambda: out.append("thread")); t.start(); t.join()
r, w = os.pipe(); os.write(w, b"x"); out.append(os.read(r, 1).decode())
a, b = socket.socketpair(); a.send(b"y"); out.append(b.recv(1).decode())
m = mmap.mmap(-1, 1 << 20); m[:1] = b"z"; out.append(m[:1].decode())
out.append(asyncio.run(asyncio.sleep(0, "loop")))
print(" ".join(out), select.select([r], [], [], 0)[0] == [])
"""
    assert run_codes(jailed, code)[0].content == "thread x y z loop True\n"


# -- what list-plugins and the log say -----------------------------------------------------------------------------


def test_the_whole_jail_limits_in_force_are_named(jailed, caplog):
    """Where a control group holds the jail, or only per-process limits and the OOM score do, is said."""
    assert jailed.limits_mode.startswith(("a cgroup v1 per call", "a cgroup v2 per call", "per-process limits"))
    scaffold = Path(sys.executable).with_name("scaffold")
    if not scaffold.exists():
        pytest.skip("needs the scaffold command")
    listing = subprocess.run([str(scaffold), "list-plugins"], capture_output=True, text=True, timeout=120)
    notes = [line for line in (listing.stdout + listing.stderr).splitlines() if "python tool" in line]
    assert notes and ("cgroup" in notes[0] or "per-process limits" in notes[0]), listing.stdout


def test_the_jail_root_holds_copies_not_links_to_host_files(jailed):
    """Hard links would be the host's own files: an inotify watch inside would see the host's reads."""
    root = jailed._jail.root.path
    os_py = Path(os.__file__).resolve()
    copy = Path(str(root) + str(os_py))
    assert copy.read_bytes() == os_py.read_bytes()
    assert copy.stat().st_ino != os_py.stat().st_ino and copy.stat().st_nlink == 1


# -- found by attacking the jail once more ------------------------------------------------------------------------


def test_other_system_call_interfaces_kill_the_program(big_jail_only, kit):
    """The x32 and ia32 system-call interfaces have numbers of their own that a filter written for x86-64
    would not match: such a call kills the program, and the result says why."""
    if platform.machine() != "x86_64":
        pytest.skip("x32 is an x86-64 interface")
    code = with_native_code(kit, """
import ctypes
print("before", flush=True)
print("x32 keyctl", libc.syscall(ctypes.c_long(0x40000000 | 250), 0, -3, 0), ctypes.get_errno(), flush=True)
""")
    ia32 = with_native_code(kit, """
import ctypes, mmap
code = bytes([0xb8, 0x20, 0x01, 0x00, 0x00, 0xcd, 0x80, 0xc3])  # mov eax, 288 (ia32 keyctl); int 0x80; ret
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
call = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
print("before", flush=True)
print("ia32 keyctl", call(), flush=True)
""")
    for result in run_codes(big_jail_only, code, ia32):
        assert result.metadata["status"] == "forbidden", result
        assert "before" in result.content and "keyctl" not in result.content
        assert "system call the sandbox forbids" in result.content


def test_empty_files_count_toward_the_jails_memory(big_jail_only):
    """The work directory's size cap counts bytes, not files: a flood of empty files costs the kernel memory
    for each. Under a control group that memory is the jail's, so the flood stops there."""
    if not big_jail_only.limits_mode.startswith("a cgroup"):
        pytest.skip("without a control group the number of files is bounded only by the call's time (documented)")
    tool = require_jail(PythonTool(audit_hook=False, memory_mb=32, workdir_mb=16, total_memory_mb=64, timeout=30.0))
    code = """
import os
n = 0
while n < 2_000_000:
    os.close(os.open(f"f{n}", os.O_CREAT | os.O_WRONLY))
    n += 1
print("made them all")
"""
    result = run_codes(tool, code)[0]
    assert result.metadata["status"] == "memory" and result.metadata["oom_kills"] >= 1, result
    assert "64 MiB of memory in all" in result.content and "made them all" not in result.content


def test_the_jails_cpu_bandwidth_is_capped(big_jail_only):
    """Each process's CPU seconds are limited, but many processes at once could take every core; a control
    group holds the whole jail to its share (cpus)."""
    if not big_jail_only.limits_mode.startswith("a cgroup"):
        pytest.skip("needs a control group")
    if "cpu" not in big_jail_only.limits_mode:
        pytest.skip("the cpu controller is not available here")
    tool = require_jail(PythonTool(audit_hook=False, cpus=0.2, **FAST))
    code = """
import os, resource, time
pids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            pass
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(round(usage.ru_utime + usage.ru_stime, 2))
"""
    used = float(run_codes(tool, code)[0].content)
    assert used <= 0.2 * 2.0 + 0.35, used  # four busy processes for 2 s: 8 CPU-seconds uncapped
