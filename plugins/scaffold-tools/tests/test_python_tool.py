"""The python tool: output, limits (CPU, wall clock, memory, output, file size), refusals (network,
processes, writes outside its directory), cleanup (no process or file left behind), and isolation:
bubblewrap by default, refusing to start without it, ``isolation: none`` only when asked and loudly.
The jail itself is attacked in test_sandbox_escapes.py."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jail_helpers import require_jail

from scaffold_core.errors import ConfigError
from scaffold_core.plugins.options import validate_options
from scaffold_core.tool import ToolContext, check_tool, invoke_tool
from scaffold_tools import jail as jail_module
from scaffold_tools.python_tool import NO_OUTPUT, UNISOLATED_WARNING, PythonTool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the python tool's limits are Linux's")

FAST = {"timeout": 5.0, "cpu_seconds": 2, "memory_mb": 256, "file_mb": 1, "max_output_bytes": 2000}
ISOLATIONS = ["bubblewrap", "none"]


@pytest.fixture
def tmp_root(tmp_path) -> Path:
    """Where the runs' private directories go: it must be empty after every run."""
    root = tmp_path / "runs"
    root.mkdir()
    yield root
    assert list(root.iterdir()) == [], "a run left its directory behind"
    assert processes_in(root) == [], "a run left a process behind"


def processes_in(root: Path) -> list[int]:
    """Pids of live processes whose working directory is under ``root`` (deleted or not)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cwd.startswith(str(root)) and state != "Z":
            found.append(int(entry))
    return found


_STARTED: dict[tuple, PythonTool] = {}


def run(code: str, tmp_root: Path, **options):
    """Run ``code`` on a python tool with ``options`` (bubblewrap unless ``isolation`` says otherwise); tools
    are started once per set of options (their ``tmp_root`` is each test's own)."""
    settings = {**FAST, **options}
    key = tuple(sorted((k, repr(v)) for k, v in settings.items()))
    tool = _STARTED.get(key)
    if tool is None:
        tool = _STARTED[key] = PythonTool(**settings)
        if tool.isolation == "bubblewrap":
            require_jail(tool)
    tool.tmp_root = str(tmp_root)
    return asyncio.run(invoke_tool(tool, {"code": code}, ToolContext("ep", "call")))


def run_many(codes, tmp_root: Path, **options):
    """Like :func:`run`, for several programs at once (concurrently); results in order."""
    run("pass", tmp_root, **options)  # starts the tool
    tool = _STARTED[tuple(sorted((k, repr(v)) for k, v in {**FAST, **options}.items()))]

    async def main():
        return await asyncio.gather(*(invoke_tool(tool, {"code": c}, ToolContext("ep", str(i)))
                                      for i, c in enumerate(codes)))

    return asyncio.run(main())


# -- ordinary programs -------------------------------------------------------------------------


def test_prints_stdout(tmp_root):
    result = run("print('hello')\nprint(6 * 7)", tmp_root)
    assert result.ok and result.content == "hello\n42\n"
    assert result.metadata["exit_code"] == 0 and result.metadata["status"] == "ok"


def test_a_final_expression_is_printed_like_a_notebook_cell(tmp_root):
    assert run("x = 21\nx * 2", tmp_root).content == "42\n"
    assert run("x = 21\nx * 2", tmp_root, print_last_expression=False).content == NO_OUTPUT
    assert run("None", tmp_root).content == NO_OUTPUT


def test_standard_library_works_and_unicode_round_trips(tmp_root):
    result = run("import math, json, fractions\nprint(json.dumps({'r': math.comb(10, 3)}), "
                 "fractions.Fraction(1, 3) + fractions.Fraction(1, 6), 'π ≈ 3.14')", tmp_root)
    assert result.ok and result.content == '{"r": 120} 1/2 π ≈ 3.14\n'


def test_an_exception_returns_the_programs_traceback_and_output(tmp_root):
    result = run("print('before')\ndef f():\n    return 1 / 0\nf()", tmp_root)
    assert not result.ok and result.error == "failed"
    assert result.content.startswith("before\nTraceback (most recent call last):")
    assert 'File "main.py", line 3, in f' in result.content
    assert "ZeroDivisionError: division by zero" in result.content
    assert "sandbox_boot" not in result.content
    assert "exit status 1" in result.content


def test_a_syntax_error_is_reported(tmp_root):
    result = run("def f(:\n    pass", tmp_root)
    assert result.error == "failed" and "SyntaxError" in result.content and 'File "main.py", line 1' in result.content


def test_exit_status_is_reported(tmp_root):
    result = run("import sys\nprint('partial')\nsys.exit(3)", tmp_root)
    assert result.error == "failed" and result.metadata["exit_code"] == 3
    assert result.content == "partial\n[the program failed with exit status 3]"


def test_files_inside_the_working_directory_are_allowed(tmp_root):
    code = ("import os\nos.mkdir('sub')\nopen('sub/a.txt', 'w').write('data')\n"
            "os.rename('sub/a.txt', 'b.txt')\nprint(open('b.txt').read(), sorted(os.listdir('.')))")
    result = run(code, tmp_root)
    assert result.ok, result.content
    assert result.content == "data ['b.txt', 'main.py', 'sub']\n"


def test_the_jail_writes_nothing_on_the_host(tmp_root):
    result = run("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd(), sorted(os.listdir('.')))", tmp_root)
    assert result.content == "/sandbox ['left.txt', 'main.py']\n" and result.metadata["isolation"] == "bubblewrap"
    # the tmp_root fixture checks that nothing was made there


def test_without_isolation_the_private_directory_is_removed_afterwards(tmp_root):
    result = run("import os\nopen('left.txt', 'w').write('x')\nos.chmod('.', 0o500)\nprint(os.getcwd())", tmp_root,
                 isolation="none")
    workdir = Path(result.content.strip())
    assert workdir.parent == tmp_root.resolve()
    assert not workdir.exists()


def test_without_isolation_concurrent_calls_get_their_own_directories(tmp_root):
    tool = PythonTool(tmp_root=str(tmp_root), max_concurrent=2, isolation="none", **FAST)

    async def main():
        code = "import os\nopen('mine.txt', 'w').write(os.getcwd())\nprint(open('mine.txt').read())"
        return await asyncio.gather(*(invoke_tool(tool, {"code": code}, ToolContext("ep", str(i))) for i in range(4)))

    results = asyncio.run(main())
    assert all(r.ok for r in results)
    assert len({r.content for r in results}) == 4


# -- limits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_infinite_loop_hits_the_cpu_limit(tmp_root, isolation):
    start = time.monotonic()
    result = run("while True:\n    pass", tmp_root, cpu_seconds=1, timeout=20, isolation=isolation)
    assert not result.ok and result.error == "limit" and result.metadata["status"] == "cpu"
    assert "1 s of CPU time" in result.content
    assert time.monotonic() - start < 10


def test_a_sleeping_program_hits_the_wall_clock_limit(tmp_root):
    start = time.monotonic()
    result = run("import time\nprint('started')\ntime.sleep(60)", tmp_root, timeout=1)
    assert not result.ok and result.error == "timeout"
    assert result.content.startswith("started\n") and "1 s time limit" in result.content
    assert time.monotonic() - start < 8


def test_a_cancelled_call_kills_the_program_and_cleans_up(tmp_root):
    tool = PythonTool(tmp_root=str(tmp_root), **{**FAST, "timeout": 30})
    start = time.monotonic()
    result = asyncio.run(invoke_tool(tool, {"code": "import time\ntime.sleep(60)"}, ToolContext("ep", "c"),
                                     timeout=0.5))
    assert result.error == "timeout" and "timed out after 0.5 s" in result.content
    assert time.monotonic() - start < 8
    # the fixture checks that neither the process nor its directory is left


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_memory_hog_hits_the_memory_limit(tmp_root, isolation):
    result = run("x = bytearray(1024 ** 3)\nprint('allocated')", tmp_root, memory_mb=128, isolation=isolation)
    assert not result.ok and result.error == "limit" and result.metadata["status"] == "memory"
    assert "128 MiB" in result.content and "allocated" not in result.content


def test_gradual_memory_hog_hits_the_memory_limit(tmp_root):
    result = run("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 20))", tmp_root, memory_mb=96)
    assert result.error == "limit" and result.metadata["status"] == "memory"


def test_huge_output_is_truncated_keeping_head_and_tail(tmp_root):
    result = run("print('START')\nprint('x' * 100_000)\nprint('END')", tmp_root, max_output_bytes=1000)
    assert result.ok
    assert result.content.startswith("START") and result.content.rstrip().endswith("END")
    assert "bytes of output omitted" in result.content
    assert len(result.content) < 1200
    assert result.metadata["truncated"] and result.metadata["stdout_bytes"] > 100_000


def test_endless_output_is_stopped(tmp_root):
    start = time.monotonic()
    result = run("while True:\n    print('y' * 1000)", tmp_root, max_output_bytes=500, cpu_seconds=30, timeout=30)
    assert result.error == "limit" and result.metadata["status"] == "output"
    assert "printed more than 500 bytes" in result.content
    assert time.monotonic() - start < 20


def test_file_size_is_limited(tmp_root):
    result = run("open('big.bin', 'wb').write(b'0' * (2 << 20))", tmp_root, file_mb=1)
    assert result.error == "failed" and "File too large" in result.content


def test_a_long_program_is_refused(tmp_root):
    result = run("x = 1\n" * 100, tmp_root, max_code_bytes=100)
    assert result.error == "limit" and "the limit is 100" in result.content


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_writing_outside_the_working_directory_is_refused(tmp_root, tmp_path, isolation):
    target = tmp_path / "outside.txt"
    codes = (f"open({str(target)!r}, 'w').write('x')",
             "open('../escaped.txt', 'w').write('x')",
             f"import os\nos.close(os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT))",
             f"import shutil\nshutil.copy('main.py', {str(target)!r})",
             f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')")
    for code, result in zip(codes, run_many(codes, tmp_root, isolation=isolation)):
        assert result.error == "failed", code
        if isolation == "none":  # in the jail /tmp is the work directory: the host path is simply not there
            assert "PermissionError: sandbox: writing" in result.content, code
    assert not target.exists()
    assert not (tmp_root / "escaped.txt").exists()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_changing_files_outside_the_working_directory_is_refused(tmp_root, tmp_path, isolation):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    victim.chmod(0o644)
    codes = (f"import os\nos.remove({str(victim)!r})",
             f"import os\nos.rename({str(victim)!r}, 'stolen.txt')",
             f"import os\nos.chmod({str(victim)!r}, 0o777)",
             f"import os\nos.truncate({str(victim)!r}, 0)",
             f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
             f"import os\nos.symlink({str(tmp_path)!r}, 'link')\nopen('link/new.txt', 'w').write('x')",
             f"import os\nos.link({str(victim)!r}, 'hard')",
             f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
             "os.close(os.open('new.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd))",
             f"import os\nf = open({str(victim)!r})\nos.chmod(f.fileno(), 0o777)",
             f"import sqlite3\nsqlite3.connect({str(tmp_path / 'db.sqlite')!r})")
    for code, result in zip(codes, run_many(codes, tmp_root, isolation=isolation)):
        assert result.error == "failed", (code, result.content)
        if isolation == "none":  # in the jail the host's files are simply not there
            assert "PermissionError: sandbox:" in result.content, (code, result.content)
    assert victim.read_text() == "keep me"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "victim.txt"]


def test_reading_another_process_is_refused(tmp_root):
    result = run(f"print(open('/proc/{os.getpid()}/environ').read())", tmp_root)
    assert result.error == "failed" and "(another process) is not allowed" in result.content
    assert run("print(open('/proc/self/status').read().split()[0])", tmp_root).content == "Name:\n"


def test_network_access_fails(tmp_root):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        port = server.getsockname()[1]
        for code in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
                     "import socket\nsocket.getaddrinfo('localhost', 80)",
                     "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9', timeout=2)"):
            result = run(code, tmp_root)
            assert result.error == "failed", code
            assert "network access is disabled" in result.content, (code, result.content)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever connected
    finally:
        server.close()


def test_in_the_jail_there_is_only_loopback(tmp_root):
    code = "print(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))"
    result = run(code, tmp_root, audit_hook=False)
    assert result.ok, result.content
    assert result.content == "['lo']\n" and result.metadata["isolation"] == "bubblewrap"


def test_without_isolation_the_hook_still_refuses_the_network(tmp_root):
    result = run("import socket\nsocket.socket()", tmp_root, isolation="none")
    assert result.metadata["isolation"] == "none"
    assert "network access is disabled" in result.content


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_fork_bomb_is_refused_and_leaves_nothing(tmp_root, isolation):
    start = time.monotonic()
    result = run("import os\nwhile True:\n    os.fork()", tmp_root, isolation=isolation)
    assert result.error == "failed" and "starting processes is disabled" in result.content
    assert time.monotonic() - start < 10
    # the fixture checks that no process is left


PROCESS_STARTS = [
    "import subprocess\nsubprocess.run(['sleep', '60'])",
    "import os\nos.system('sleep 60')",
    "import os\nos.posix_spawn('/bin/sleep', ['sleep', '60'], {})",
    "import os\nos.execv('/bin/sleep', ['sleep', '60'])",
    "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "import pty\npty.fork()",
    "import ctypes",
]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_starting_processes_is_refused(tmp_root, isolation):
    # Without the jail, _posixsubprocess is refused too: calling it directly starts processes unseen.
    codes = PROCESS_STARTS + (["import _posixsubprocess"] if isolation == "none" else [])
    for code, result in zip(codes, run_many(codes, tmp_root, isolation=isolation)):
        assert result.error == "failed", code
        assert "starting processes is disabled" in result.content or "importing" in result.content, result.content


def test_asyncio_and_subprocess_import_in_the_jail(tmp_root):
    code = ("import asyncio, subprocess\nasync def main():\n    await asyncio.sleep(0)\n    return 7\n"
            "print(asyncio.run(main()))")
    assert run(code, tmp_root).content == "7\n"


def test_only_the_standard_library_and_allowed_site_packages_import(tmp_root, tmp_path):
    """The audit hook is an allow-list of importable modules."""
    result = run("import yaml", tmp_root)
    assert result.error == "failed" and "importing yaml is not allowed" in result.content, result.content
    site = tmp_path / "site"
    (site / "helper").mkdir(parents=True)
    (site / "helper" / "__init__.py").write_text("import json\nANSWER = json.loads('42')\n")
    ran = tmp_path / "pth-ran"
    (site / "evil.pth").write_text(f"import pathlib; pathlib.Path({str(ran)!r}).write_text('x')\n")
    for isolation in ISOLATIONS:
        result = run("import helper\nprint(helper.ANSWER)", tmp_root, isolation=isolation, site_packages=[str(site)])
        assert result.content == "42\n", result.content
    assert not ran.exists(), "a .pth file in the allowed site-packages ran"


@pytest.mark.slow
def test_site_packages_true_imports_the_environments_packages(tmp_root):
    result = run("import yaml\nprint(yaml.safe_load('a: [1, 2]'))", tmp_root, site_packages=True)
    assert result.content == "{'a': [1, 2]}\n", result.content


def test_signalling_other_processes_and_raising_limits_are_refused(tmp_root):
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        result = run(f"import os, signal\nos.kill({bystander.pid}, signal.SIGTERM)", tmp_root)
        assert "signalling other processes is not allowed" in result.content
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(timeout=10)
    result = run("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))", tmp_root)
    assert "changing resource limits is not allowed" in result.content


def test_without_isolation_processes_left_in_the_group_are_killed(tmp_root, tmp_path):
    """The process-group kill is the backstop: a wrapper starts a sleeper in the program's group."""
    wrapper = tmp_path / "python-with-a-sleeper"
    wrapper.write_text(f"#!/bin/sh\nsleep 300 &\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    result = run("print('done')", tmp_root, python=str(wrapper), isolation="none")
    assert result.ok and result.content == "done\n"
    deadline = time.monotonic() + 5
    while processes_in(tmp_root) and time.monotonic() < deadline:  # SIGKILL was sent; let it land
        time.sleep(0.05)
    assert processes_in(tmp_root) == []


# -- options and definition --------------------------------------------------------------------


def test_definition_and_spec():
    tool = PythonTool()
    check_tool(tool)
    spec = tool.spec()["function"]
    assert spec["name"] == "python" and spec["parameters"]["required"] == ["code"]
    assert tool.timeout > tool.limits.wall_seconds  # invoke_tool's bound leaves room to start and clean up
    assert tool.isolation == "bubblewrap" and tool.audit_hook


def test_options_are_validated():
    with pytest.raises(ConfigError, match="isolation"):
        validate_options(PythonTool, {"isolation": "maybe"}, path="tools.python", label="tool 'python'")
    with pytest.raises(ConfigError, match="Did you mean 'memory_mb'"):
        validate_options(PythonTool, {"memory_mbs": 64}, path="tools.python", label="tool 'python'")
    with pytest.raises(ConfigError, match=r"tools\.python\.memory_mb: Input should be greater than or equal to 32; "
                                          r"got 8 .*memory_mb: int \(>= 32\) = 512"):
        validate_options(PythonTool, {"memory_mb": 8}, path="tools.python", label="tool 'python'")
    with pytest.raises(ConfigError, match=r"tools\.python\.workdir_mb: Input should be greater than 0; got 0"):
        validate_options(PythonTool, {"workdir_mb": 0}, path="tools.python", label="tool 'python'")
    with pytest.raises(ValueError, match="is not an executable file"):
        PythonTool(python="/no/such/python")


@pytest.mark.parametrize("value", ["auto", "on", True, "off"])
def test_the_removed_namespaces_option_names_its_replacement(value):
    from scaffold_core.plugins.options import build_component
    from scaffold_core.plugins.registry import ComponentInfo

    info = ComponentInfo(kind="tool", name="python", factory=PythonTool, plugin="tools", distribution="scaffold-tools")
    with pytest.raises(ConfigError) as caught:
        build_component(info, {"namespaces": value}, path="controller.tools[0]")
    message = str(caught.value)
    assert message.startswith("controller.tools[0]:") and "replaced by isolation: bubblewrap" in message
    assert "isolation: none" in message and "\n" not in message


def test_empty_program_is_a_bad_argument(tmp_root):
    assert run("   \n", tmp_root).error == "bad_arguments"


def test_a_lone_surrogate_in_the_program_is_a_bad_argument(tmp_root):
    result = run("print('\ud800')", tmp_root)
    assert result.error == "bad_arguments" and "lone surrogate ('\\ud800' at character 7)" in result.content


# -- no silent downgrade -----------------------------------------------------------------------


def test_without_bubblewrap_the_tool_refuses_to_start_saying_how_to_get_it(monkeypatch, tmp_root):
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "bwrap" else which(name))
    with pytest.raises(ConfigError) as caught:
        asyncio.run(PythonTool(**FAST).start())
    message = str(caught.value)
    assert "bubblewrap (bwrap) is not installed" in message and "apt-get install bubblewrap" in message
    assert "isolation: none" in message and "\n" not in message
    # a call without start() fails the same way: it never runs the program unjailed
    tool = PythonTool(tmp_root=str(tmp_root), **FAST)
    result = asyncio.run(invoke_tool(tool, {"code": "print('ran')"}, ToolContext("ep", "c")))
    assert result.error == "failed" and "bubblewrap (bwrap) is not installed" in result.content


def test_a_bubblewrap_too_old_to_cap_the_work_directory_is_refused(monkeypatch):
    jail_module.bwrap_version.cache_clear()
    monkeypatch.setattr(jail_module, "bwrap_version", lambda path: (0, 6, 1))
    with pytest.raises(ConfigError, match=r"bubblewrap 0\.6\.1 .* cannot cap the work directory's size"):
        asyncio.run(PythonTool(**FAST).start())


def test_a_jail_that_cannot_start_fails_at_start_with_the_fix(tmp_path, monkeypatch):
    """Where user namespaces are disabled bwrap exits with an error: start() says what to enable."""
    monkeypatch.setattr(jail_module, "host_uid", lambda: None)  # the fake in tmp_path is run as this user
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'bubblewrap 0.8.0'; exit 0; }\n"
                    "echo 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(ConfigError) as caught:
        asyncio.run(PythonTool(bwrap=str(fake), **FAST).start())
    message = str(caught.value)
    assert "No permissions to creating new namespace" in message and "user namespaces" in message
    assert "isolation: none" in message


def test_isolation_none_warns_loudly_and_says_so_in_every_result(tmp_root, capsys):
    tool = PythonTool(isolation="none", tmp_root=str(tmp_root), **FAST)
    asyncio.run(tool.start())
    assert UNISOLATED_WARNING in capsys.readouterr().err
    result = asyncio.run(invoke_tool(tool, {"code": "print('fine')"}, ToolContext("ep", "c")))
    assert result.content == "fine\n" and result.metadata["isolation"] == "none"


def test_whole_jail_options_are_validated():
    with pytest.raises(ValueError, match="total_memory_mb .* must be at least memory_mb"):
        PythonTool(memory_mb=256, total_memory_mb=128)
    with pytest.raises(ConfigError, match=r"tools\.python\.cpus: Input should be greater than 0; got 0"):
        validate_options(PythonTool, {"cpus": 0}, path="tools.python", label="tool 'python'")
    with pytest.raises(ConfigError, match="cgroup"):
        validate_options(PythonTool, {"cgroup": "maybe"}, path="tools.python", label="tool 'python'")
    assert PythonTool(memory_mb=100, workdir_mb=300).limits.total_memory_mb == 400
    assert PythonTool(memory_mb=512).limits.total_memory_mb == 1024


def test_cgroup_require_refuses_to_start_without_one_and_off_never_makes_one(monkeypatch):
    from scaffold_tools import python_tool as module

    monkeypatch.setattr(module, "find_cgroups", lambda change=True: (None, "no cgroup file system is mounted"))
    jail_module.check_bwrap()  # (where there is no bubblewrap, the tool refuses for that reason first)
    with pytest.raises(ConfigError, match="cgroup: require, but no control group .*no cgroup file system"):
        asyncio.run(PythonTool(cgroup="require", **FAST).start())
    fallback = require_jail(PythonTool(**FAST))
    assert fallback.limits_mode.startswith("per-process limits and OOM score 1000")
    monkeypatch.undo()
    off = require_jail(PythonTool(cgroup="off", **FAST))
    assert off.limits_mode.startswith("per-process limits") and "cgroup: off" in off.limits_mode
    result = asyncio.run(invoke_tool(off, {"code": "print(open('/proc/self/oom_score_adj').read())"},
                                     ToolContext("ep", "off")))
    assert result.content.strip() == "1000"
