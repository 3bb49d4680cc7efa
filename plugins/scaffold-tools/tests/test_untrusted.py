"""scaffold_tools.run_untrusted: the public way for other plugins (rubrics, environments) to run a model's
program in the python tool's jail."""

from __future__ import annotations

import asyncio
import sys

import pytest
from jail_helpers import bubblewrap_or_skip

import scaffold_tools

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the jail is Linux's")


def run(code: str, **options):
    return asyncio.run(scaffold_tools.run_untrusted(code, timeout=5.0, cpu_seconds=2, memory_mb=256, **options))


def test_a_program_runs_in_the_jail_and_its_output_comes_back():
    bubblewrap_or_skip()
    result = run("import os\nprint(sum(range(101)), os.getuid())")
    assert result.ok and result.isolation == "bubblewrap"
    total, uid = result.stdout.split()
    assert total == "5050" and uid == "65534"  # the jail's unprivileged user, not the caller


def test_the_jail_holds_what_it_holds_for_the_tool():
    bubblewrap_or_skip()
    network = run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)", audit_hook=False)
    assert not network.ok and "Error" in network.stderr
    home = run("import os\nprint(os.path.exists(os.path.expanduser('~/.ssh')), os.listdir('/'))")
    assert home.ok and home.stdout.startswith("False")
    spin = run("while True: pass")
    assert spin.status in ("cpu", "timeout")


def test_a_failing_program_says_so():
    bubblewrap_or_skip()
    result = run("raise SystemExit(3)")
    assert result.status == "error" and result.exit_code == 3 and not result.ok
