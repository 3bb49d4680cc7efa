"""The suite's leak guard itself: a session that leaves a process, a port or a temp file fails."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from scaffold_testkit.leakguard import GRACE_ENV

LEAKY = '''
import socket, subprocess, sys, tempfile

def test_leaks():
    global keep
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen()
    tempfile.mkstemp(suffix=".leak")
    keep = (proc, sock)
'''

CLEAN = '''
import subprocess, sys, tempfile

def test_clean(tmp_path):
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=30)
    with tempfile.TemporaryDirectory() as d:
        open(d + "/x", "w").write("x")
    (tmp_path / "kept-by-pytest").write_text("ok")
'''


#: the guard in one pytest process, and under pytest-xdist (as `make test` runs the suite): a worker's sockets
#: are checked by the worker and reported to the controller, its processes and temp files by the controller
SESSIONS = pytest.mark.parametrize("options", [[], ["-n", "2"]], ids=["one process", "two xdist workers"])


def run_pytest(tmp_path, source: str, options: list[str]) -> subprocess.CompletedProcess:
    test = tmp_path / "test_case.py"
    test.write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("SCAFFOLD_TEST_SESSION",)}
    env["TMPDIR"] = str(tmp_path)  # the inner session keeps its temp dir after a failure: inside ours
    env[GRACE_ENV] = "1"  # the leaked process never exits: waiting the full grace proves nothing more
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "scaffold_testkit.leakguard", *options, str(test)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


@SESSIONS
def test_guard_reports_and_fails_a_leaky_session(tmp_path, options):
    proc = run_pytest(tmp_path, LEAKY, options)
    assert proc.returncode == 1, proc.stdout
    assert "left behind by the tests" in proc.stdout
    assert "process" in proc.stdout and "time.sleep(60)" in proc.stdout
    assert "listening socket" in proc.stdout and ("test worker gw" in proc.stdout) == bool(options)
    assert "temp file left behind" in proc.stdout and ".leak" in proc.stdout


@SESSIONS
def test_guard_passes_a_clean_session(tmp_path, options):
    proc = run_pytest(tmp_path, CLEAN, options)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "left behind" not in proc.stdout
