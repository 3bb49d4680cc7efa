"""The installed ``scaffold`` command ends its process at once when it is done (``cli.main.console``): what a
normal exit does that anyone relies on still happens, and the exit code is the command's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
from scaffold_core.cli import console

out = Path(sys.argv[1])
data = open(out / "left-open.txt", "w")  # a plugin's file nobody closes: its buffer must still reach the disk
data.write("x" * 1000)
atexit.register(lambda: (out / "atexit.txt").write_text("ran"))
if sys.argv[2] == "thread":  # a thread still working: the interpreter's own exit waits for it
    threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread.txt").write_text("done"))).start()
sys.argv = ["scaffold", *sys.argv[3:]]
sys.exit(console())
"""


def run(tmp_path: Path, thread: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "entry.py"
    script.write_text(textwrap.dedent(SCRIPT), encoding="utf-8")
    return subprocess.run([sys.executable, str(script), str(tmp_path), thread, *args], capture_output=True,
                          text=True, timeout=120)


def test_a_finished_command_flushes_open_files_and_runs_exit_functions(tmp_path):
    done = run(tmp_path, "none", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("scaffold")
    assert (tmp_path / "left-open.txt").read_text() == "x" * 1000
    assert (tmp_path / "atexit.txt").read_text() == "ran"


def test_the_exit_code_is_the_commands_and_a_running_thread_is_waited_for(tmp_path):
    done = run(tmp_path, "thread", "no-such-command")
    assert done.returncode == 2 and "invalid choice" in done.stderr
    assert (tmp_path / "thread.txt").read_text() == "done"
    assert (tmp_path / "left-open.txt").read_text() == "x" * 1000
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    usage = run(tmp_path, "none")  # no command: the help, and the usage code
    assert usage.returncode == 2 and "usage" in usage.stdout
