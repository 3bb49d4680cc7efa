"""Fixtures for the scaffold-vllm tests: the protocol test server as a subprocess, and no server left behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from vllm_testkit import ServerSubprocess  # noqa: E402


@pytest.fixture
def server_subprocess(tmp_path):
    """``start(*args)`` runs a test server subprocess; every one is killed at the end of the test."""
    started: list[ServerSubprocess] = []

    def start(*args: str, port: int | None = None) -> ServerSubprocess:
        proc = ServerSubprocess(tmp_path, *args, port=port).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture(autouse=True)
def no_leftover_servers():
    """Every test must stop the servers it launched (the launcher's own registry says which are alive)."""
    from scaffold_core.remote.launcher import live_servers

    yield
    left = live_servers()
    for server in left:
        server.stop(timeout=2.0)
    assert not left, f"servers left running after the test: {[s.url for s in left]}"
