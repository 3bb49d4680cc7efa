"""The python tool's jail, attacked as a hostile model would, under the default configuration.

Every attack runs twice: with the default configuration (bubblewrap and the audit hook) and with the
jail alone (``audit_hook: false``), which is what is left to a program that gets past the hook. Each
test checks the host side (no file outside the jail, a bystander process alive, nothing listening
reached, nothing left running), not only what the program printed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from jail_helpers import FAST, marked_processes, native_code_kit, require_jail, run_codes, with_native_code

from scaffold_core.tool import ToolContext, invoke_tool
from scaffold_tools.jail import JAIL_UID
from scaffold_tools.python_tool import PythonTool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap is Linux's")

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["default", "jail only"])
def tool(request, jailed, jail_only) -> PythonTool:
    return jailed if request.param == "default" else jail_only


def output(result) -> str:
    return result.content


# -- the audit hook is not the boundary -------------------------------------------------------------


def test_blanking_the_hooks_policy_through_frames_writes_nothing_outside(tool, tmp_path):
    """The hook's frames are reachable from a traceback; rebinding its module's globals and the builtins it
    once looked up must not open the way (the hook keeps its own copies), and past it the jail holds."""
    target = tmp_path / "escaped.txt"
    code = f"""
import builtins, sys
target = {str(target)!r}
try:
    open(target, "w")
except Exception as exc:
    tb = exc.__traceback__
    while tb is not None:
        g = tb.tb_frame.f_globals
        for key, value in list(g.items()):
            if key.startswith("_") and isinstance(value, (frozenset, dict, set, tuple)) and key != "__builtins__":
                g[key] = type(value)()
        tb = tb.tb_next
builtins.isinstance = lambda *a: True
builtins.any = lambda *a: False
report = []
for attempt in (lambda: open(target, "w").write("escaped"),
                lambda: __import__("os").system("echo escaped > " + target),
                lambda: __import__("ctypes").CDLL(None),
                lambda: __import__("shutil").copy("main.py", target),
                lambda: __import__("os").open(target, 0o101)):
    try:
        attempt()
        report.append("ran")
    except BaseException as exc:
        report.append(type(exc).__name__)
print("report", report)
"""
    result = run_codes(tool, code)[0]
    assert "report [" in output(result), output(result)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_subinterpreters_and_native_code_modules_are_not_there(tool, tmp_path):
    """Subinterpreters run without the hook; ctypes and the C-API test modules reach anything. None loads,
    also not from the host's path of the file."""
    target = tmp_path / "from-subinterpreter.txt"
    spec = importlib.util.find_spec("_testcapi")
    host_file = spec.origin if spec is not None and spec.origin else "/nonexistent/_testcapi.so"
    code = f"""
import importlib.machinery, importlib.util
for name in ("_xxsubinterpreters", "_testcapi", "_testinternalcapi", "ctypes", "_ctypes", "readline"):
    try:
        module = __import__(name)
        print(name, "IMPORTED")
        if name == "_xxsubinterpreters":
            module.run_string(module.create(), "open({str(target)!r}, 'w').write('x')")
        if name == "_testcapi":
            module.run_in_subinterp("open({str(target)!r}, 'w').write('x')")
    except BaseException as exc:
        print(name, "refused", type(exc).__name__)
try:
    loader = importlib.machinery.ExtensionFileLoader("_testcapi", {host_file!r})
    spec = importlib.util.spec_from_file_location("_testcapi", {host_file!r}, loader=loader)
    importlib.util.module_from_spec(spec)
    print("host file LOADED")
except BaseException as exc:
    print("host file refused", type(exc).__name__)
"""
    text = output(run_codes(tool, code)[0])
    assert text.count("refused") == 7, text
    assert "IMPORTED" not in text and "LOADED" not in text
    assert not target.exists()


def test_native_code_the_program_brings_along_changes_nothing_outside(tmp_path):
    """The jail root leaves ctypes out, and the hook refuses it under any name; a program that brings its
    own copy (written into the work directory, loaded under another package's name) gets past the hook when
    it is off, and then calls libc directly: the kernel still refuses everything outside."""
    kit = native_code_kit()
    if kit is None:
        pytest.skip("needs the host's _ctypes extension and libffi to bring along")
    target = tmp_path / "native.txt"
    bystander = subprocess.Popen(["sleep", "60"])
    code = with_native_code(kit, f"""
print("native code runs as", libc.getuid())
for name, call in (("open", lambda: libc.open({str(target).encode()!r}, 0o101, 0o644)),
                   ("kill", lambda: libc.kill({bystander.pid}, 9)),
                   ("unshare user", lambda: libc.unshare(0x10000000)),
                   ("unshare mount", lambda: libc.unshare(0x00020000)),
                   ("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
                   ("setuid", lambda: libc.setuid(0)),
                   ("chroot", lambda: libc.chroot(b"/usr"))):
    print(name, call(), ctypes.get_errno())
""")
    try:
        results = []
        for hook in (True, False):
            tool = require_jail(PythonTool(audit_hook=hook, max_code_bytes=4_000_000, **FAST))
            results.append(output(run_codes(tool, code)[0]))
        hooked, bare = results
        assert "importing _ctypes is disabled" in hooked, hooked
        assert f"native code runs as {JAIL_UID}" in bare, bare
        calls = [line.split() for line in bare.splitlines()[1:]]
        assert len(calls) == 7 and all(words[-2] == "-1" for words in calls), bare
        time.sleep(0.2)
        assert bystander.poll() is None and not target.exists()
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


# -- writes the audit hook never saw ----------------------------------------------------------------


def test_c_level_writes_stay_in_the_work_directory(tool, tmp_path):
    """sqlite (file: URIs, ATTACH, VACUUM INTO), mknod and mkfifo raise no audit event for the path they
    write; readline is not there. Inside the work directory they work; outside, nothing appears."""
    victims = {name: str(tmp_path / name) for name in ("uri.db", "attached.db", "vacuumed.db", "node", "fifo",
                                                        "history")}
    code = f"""
import os, sqlite3
victims = {victims!r}
db = sqlite3.connect("inside.db")
db.execute("create table t (x)")
db.commit()
print("inside", os.path.exists("inside.db"))
attempts = {{
    "uri": lambda: sqlite3.connect("file:" + victims["uri.db"] + "?mode=rwc", uri=True).execute("create table t (x)"),
    "attach": lambda: db.execute("ATTACH DATABASE ? AS other", (victims["attached.db"],)),
    "vacuum": lambda: db.execute("VACUUM INTO ?", (victims["vacuumed.db"],)),
    "mknod": lambda: os.mknod(victims["node"]),
    "mkfifo": lambda: os.mkfifo(victims["fifo"]),
    "readline": lambda: __import__("readline").write_history_file(victims["history"]),
}}
for name, attempt in attempts.items():
    try:
        attempt()
        print(name, "ran")
    except BaseException as exc:
        print(name, type(exc).__name__)
"""
    text = output(run_codes(tool, code)[0])
    assert "inside True" in text, text
    assert all(f"{name} " in text for name in ("uri", "attach", "vacuum", "mknod", "mkfifo", "readline"))
    assert list(tmp_path.iterdir()) == [], "a write got out of the jail"


def test_site_packages_are_read_only(tmp_path):
    """A .pth file dropped into site-packages would run outside the sandbox at the next Python start."""
    site = tmp_path / "site"
    (site / "goodpkg").mkdir(parents=True)
    (site / "goodpkg" / "__init__.py").write_text("VALUE = 42\n")
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    results = []
    for hook in (True, False):
        tool = require_jail(PythonTool(site_packages=[str(site)], audit_hook=hook, **FAST))
        code = f"""
import goodpkg, os
print("imported", goodpkg.VALUE)
site = {str(site)!r}
for attempt in (lambda: open(os.path.join(site, "evil.pth"), "w").write("import os; os.system('id')"),
                lambda: open(os.path.join(site, "goodpkg", "__init__.py"), "a").write("EVIL = 1"),
                lambda: os.remove(os.path.join(site, "goodpkg", "__init__.py")),
                lambda: open(goodpkg.__file__, "w").write("EVIL = 1")):
    try:
        attempt()
        print("WROTE")
    except OSError as exc:
        print("refused", type(exc).__name__)
"""
        results.append(output(run_codes(tool, code)[0]))
    for text in results:
        assert "imported 42" in text and text.count("refused") == 4 and "WROTE" not in text, text
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == before


# -- processes ----------------------------------------------------------------------------------------


def test_host_processes_are_invisible_and_cannot_be_signalled(tool):
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        code = f"""
import os, signal
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("pids", pids)
print("commands", [open(f"/proc/{{p}}/cmdline", "rb").read().split(b"\\0")[0].decode() for p in pids])
for target in ({bystander.pid}, {os.getpid()}, {os.getpgrp()}, -{os.getpgrp()}, os.getppid(), -1, 1):
    try:
        os.kill(target, signal.SIGKILL)
        print("signalled", target)
    except OSError as exc:
        print("kill", target, type(exc).__name__)
for path in ("/proc/{bystander.pid}/cmdline", "/proc/{os.getpid()}/environ"):
    try:
        print("READ", open(path, "rb").read()[:50])
    except OSError as exc:
        print("read", type(exc).__name__)
"""
        text = output(run_codes(tool, code)[0])
        time.sleep(0.2)
        assert bystander.poll() is None, "the program killed a host process"
        pids_line = next(line for line in text.splitlines() if line.startswith("pids"))
        assert len(eval(pids_line[5:])) <= 3, text  # the jail's init, the program (and a reader)
        assert "sleep" not in text and "pytest" not in text and "READ" not in text, text
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


def test_the_program_runs_as_an_unprivileged_user_on_the_host_too(jailed, monkeypatch):
    """Inside uid 65534; outside never root, so the kernel applies RLIMIT_NPROC (it never does to root)."""
    marker = f"marker-{uuid.uuid4().hex}"
    monkeypatch.setenv("SCAFFOLD_TEST_SESSION", marker)

    async def main():
        call = asyncio.ensure_future(invoke_tool(jailed, {"code": "import os, time\nprint(os.getuid(), os.getgid())\n"
                                                                   "time.sleep(1.5)"}, ToolContext("ep", "uid")))
        await asyncio.sleep(0.8)
        seen = marked_processes(marker)
        return await call, seen

    result, seen = asyncio.run(main())
    assert result.content.startswith(f"{JAIL_UID} {JAIL_UID}")
    assert seen and all(uid != 0 for _pid, uid in seen), seen
    assert marked_processes(marker) == []


def test_a_200_process_spawn_loop_is_bounded_and_nothing_is_left(tool, monkeypatch):
    marker = f"marker-{uuid.uuid4().hex}"
    monkeypatch.setenv("SCAFFOLD_TEST_SESSION", marker)
    code = """
import os, time
started = 0
for i in range(200):
    try:
        pid = os.fork()
    except Exception as exc:
        print("stopped", type(exc).__name__)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    started += 1
print("started", started)
"""
    text = output(run_codes(tool, code)[0])
    if tool.audit_hook:
        assert "stopped PermissionError" in text and "started 0" in text, text
    else:
        started = int(text.split("started ")[1].split()[0])
        assert "stopped BlockingIOError" in text and started < tool.limits.max_processes, text
    assert marked_processes(marker) == [], "processes outlived the call"


def test_nothing_keeps_running_after_the_call(jail_only, monkeypatch):
    """A daemon that leaves the session and ignores SIGTERM and SIGHUP dies with the jail."""
    marker = f"marker-{uuid.uuid4().hex}"
    monkeypatch.setenv("SCAFFOLD_TEST_SESSION", marker)
    code = """
import os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        time.sleep(300)
    os._exit(0)
time.sleep(0.3)
print("daemon started")
"""
    assert output(run_codes(jail_only, code)[0]) == "daemon started\n"
    assert marked_processes(marker) == []


# -- what the program can read --------------------------------------------------------------------


def test_the_hosts_environment_is_unreadable(tool, monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("SCAFFOLD_ESCAPE_SECRET", secret)
    code = f"""
import os
print(dict(os.environ))
for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self", "{os.getpid()}", "{os.getppid()}"]:
    try:
        print(pid, open(f"/proc/{{pid}}/environ", "rb").read())
    except OSError as exc:
        print(pid, type(exc).__name__)
"""
    text = output(run_codes(tool, code)[0])
    assert "HOME" in text and secret not in text


def test_gold_answers_project_files_data_and_home_are_not_there(tool, tmp_path):
    gold = tmp_path / "gold.jsonl"
    token = f"gold-{uuid.uuid4().hex}"
    gold.write_text(f'{{"answer": "{token}"}}\n')
    readme_line = (REPO / "README.md").read_text().splitlines()[0]
    paths = [str(gold), str(REPO / "README.md"), str(REPO / "plugins"), "/work/shared/data",
             str(Path.home() / ".bashrc"), str(Path.home() / ".ssh"), "/etc/passwd", "/etc/shadow",
             f"/proc/1/root{gold}", f"/proc/self/root{gold}", "../" * 12 + str(gold).lstrip("/"),
             f"/proc/{os.getpid()}/cwd/README.md"]
    code = f"""
import os
for path in {paths!r}:
    try:
        if os.path.isdir(path):
            print("LISTED", path, os.listdir(path)[:20])
        else:
            print("READ", path, open(path).read()[:300])
    except OSError as exc:
        print("missing", path, type(exc).__name__)
try:
    print("home", sorted(os.listdir({str(Path.home())!r})))
except OSError:
    print("home []")
"""
    text = output(run_codes(tool, code)[0])
    assert text.count("missing") == len(paths), text
    assert token not in text and readme_line not in text
    # The home folder shows nothing but the way to the Python runtime, when the runtime lives there (pyenv).
    runtime = Path(sys.base_prefix).resolve()
    home_line = next(line for line in text.splitlines() if line.startswith("home "))
    expected = [runtime.relative_to(Path.home()).parts[0]] if runtime.is_relative_to(Path.home()) else []
    assert home_line == f"home {expected}", text


def test_a_concurrent_calls_work_directory_is_out_of_reach(jailed, jail_only):
    """Two programs run at once (under each configuration): the second cannot find the first one's files."""
    token = f"mine-{uuid.uuid4().hex}"
    owner = f"""
import time
open("secret.txt", "w").write({token!r})
print("written")
time.sleep(2.5)
"""
    thief = """
import glob, os
found = []
for pattern in ("/sandbox/*", "/tmp/*", "/proc/*/root/sandbox/*", "/proc/*/cwd/*", "/tmp/scaffold-python-*/*"):
    for path in glob.glob(pattern):
        try:
            found.append((path, open(path).read()[:100]))
        except OSError:
            pass
print(found)
"""

    async def main():
        async def call(tool, code, delay):
            await asyncio.sleep(delay)
            return await invoke_tool(tool, {"code": code}, ToolContext("ep", str(delay)))

        return await asyncio.gather(call(jailed, owner, 0), call(jail_only, owner, 0),
                                    call(jailed, thief, 0.7), call(jail_only, thief, 0.7))

    results = asyncio.run(main())
    assert [r.content for r in results[:2]] == ["written\n", "written\n"]
    for owner_result, thief_result in zip(results[:2], results[2:]):
        assert thief_result.ok and token not in thief_result.content, thief_result.content
        # the thief looked while the owner's file existed (else the test proves nothing)
        assert 0.7 + thief_result.metadata["duration_s"] < owner_result.metadata["duration_s"]


def test_the_runtime_it_sees_is_read_only(tool):
    os_py = Path(os.__file__).resolve()
    before = (os_py.stat().st_mtime_ns, os_py.read_bytes())
    code = f"""
import os
for attempt in (lambda: open(os.__file__, "a").write("# changed"), lambda: os.utime(os.__file__),
                lambda: os.chmod(os.__file__, 0o777), lambda: open({str(os_py)!r}, "a").write("# changed")):
    try:
        attempt()
        print("CHANGED")
    except OSError as exc:
        print("refused", type(exc).__name__)
"""
    text = output(run_codes(tool, code)[0])
    assert text.count("refused") == 4, text
    assert (os_py.stat().st_mtime_ns, os_py.read_bytes()) == before


# -- network -------------------------------------------------------------------------------------------


def test_loopback_and_abstract_sockets_of_the_host_are_unreachable(tool):
    listeners = []
    try:
        for family, address in ((socket.AF_INET, ("127.0.0.1", 0)), (socket.AF_INET6, ("::1", 0))):
            try:
                server = socket.socket(family, socket.SOCK_STREAM)
                server.bind(address)
            except OSError:  # no IPv6 here
                continue
            server.listen(1)
            server.setblocking(False)
            listeners.append(server)
        abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        abstract.bind(f"\0scaffold-escape-{uuid.uuid4().hex}")
        abstract.listen(1)
        abstract.setblocking(False)
        listeners.append(abstract)
        targets = [(s.family, s.getsockname()[:2]) for s in listeners]
        code = f"""
import socket
for family, address in {[(int(f), a) for f, a in targets]!r}:
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(tuple(address) if isinstance(address, list) else address)
        print("CONNECTED", address)
    except OSError as exc:
        print("refused", type(exc).__name__)
"""
        text = output(run_codes(tool, code)[0])
        assert text.count("refused") == len(targets), text
        for server in listeners:
            with pytest.raises(BlockingIOError):
                server.accept()
    finally:
        for server in listeners:
            server.close()


# -- resources -----------------------------------------------------------------------------------------


def test_total_disk_use_is_bounded(tmp_path):
    """Per-file limits do not bound the total; the work directory's size cap does (and nothing else in the
    jail is writable)."""
    for hook in (True, False):
        tool = require_jail(PythonTool(workdir_mb=4, audit_hook=hook, **FAST))
        code = """
import os
total = 0
for i in range(100):
    try:
        with open(f"f{i}.bin", "wb") as f:
            f.write(b"x" * (1 << 20))
        total += 1 << 20
    except OSError as exc:
        print("stopped", exc.strerror)
        break
for place in ("/", "/dev", "/dev/shm", "/proc", "/scaffold-sandbox"):
    try:
        open(os.path.join(place, "extra.bin"), "wb").write(b"x")
        print("WROTE", place)
    except OSError as exc:
        print("refused", place)
print("total", total)
"""
        text = output(run_codes(tool, code)[0])
        assert "stopped No space left on device" in text, text
        assert int(text.split("total ")[1]) <= 4 << 20
        assert text.count("refused") == 5 and "WROTE" not in text, text


# -- /proc, symlinks, descriptors, terminals, privileges ---------------------------------------------


def test_proc_symlinks_descriptors_and_terminals_lead_nowhere(tool, tmp_path):
    (tmp_path / "host.txt").write_text("host file")
    code = f"""
import fcntl, os, termios
os.symlink({str(tmp_path)!r}, "link")
print("through a link", os.path.exists("link/host.txt"))
print("fds", sorted(os.listdir("/proc/self/fd")))
print("fd targets", [os.readlink(f"/proc/self/fd/{{fd}}") for fd in ("0", "1", "2")])
print("sys", os.path.exists("/sys"), "etc", os.path.exists("/etc"), "hostname", os.uname().nodename)
print("root of 1", sorted(os.listdir("/proc/1/root")))
for name, attempt in (("tiocsti", lambda: fcntl.ioctl(0, termios.TIOCSTI, b"x")),
                      ("tty", lambda: os.open("/dev/tty", os.O_RDWR)),
                      ("setuid", lambda: os.setuid(0)),
                      ("chroot", lambda: os.chroot("/sandbox")),
                      ("raise nproc", lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_NPROC,
                                                                               (10**6, 10**6))),
                      ("proc sys", lambda: open("/proc/sys/kernel/hostname", "w").write("x"))):
    try:
        attempt()
        print(name, "WORKED")
    except (OSError, ValueError):  # the kernel's EPERM on raising a hard limit is a ValueError
        print(name, "refused")
"""
    text = output(run_codes(tool, code)[0])
    assert "through a link False" in text, text
    assert "fds ['0', '1', '2', '3']" in text  # 3: the listing itself
    assert "sys False etc False hostname sandbox" in text
    assert "WORKED" not in text and text.count("refused") == 6, text
    assert (tmp_path / "host.txt").read_text() == "host file" and sorted(p.name for p in tmp_path.iterdir()) == [
        "host.txt"]
    root_line = next(line for line in text.splitlines() if line.startswith("root of 1"))
    assert "work" not in root_line and "home" not in root_line and "etc" not in root_line, root_line
