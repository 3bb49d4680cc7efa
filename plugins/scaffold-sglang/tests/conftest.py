"""Fixtures for the scaffold-sglang tests: the protocol test server as a subprocess, and no server left behind."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from scaffold_testkit.remote_server import server_fixtures  # noqa: E402
from sglang_testkit import ServerSubprocess  # noqa: E402

# server_subprocess: start(*args) runs a SGLang test server subprocess; every one is killed at the end of the test.
# no_leftover_servers (autouse): a test that leaves a launched server running fails.
server_subprocess, no_leftover_servers = server_fixtures(ServerSubprocess)
