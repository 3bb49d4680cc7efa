"""The shared launcher's server processes: private logs with secrets hidden, never written through a link, their
own environment. (Launching whole engines is tested by each server plugin against its protocol test server.)"""

from __future__ import annotations

import os
import stat
import sys

import pytest
from scaffold_remote.launcher import LaunchError, LaunchOptions, ServerProcess, parse_launch_options


def test_server_output_reaches_a_private_log_with_secrets_hidden(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "env-token-0123456789")
    program = "print('args: --api-key the-key-9876543'); print('env: env-token-0123456789'); print('done')"
    server = ServerProcess(0, "127.0.0.1", [1, 2], [sys.executable, "-c", program], tmp_path / "logs" / "server.log",
                           "python -c ...", secrets=("the-key-9876543",))
    server.start(dict(os.environ))
    server.proc.wait(timeout=30)
    server.finish()
    log = server.log_path.read_text()
    assert "done" in log and "the-key-9876543" not in log and "env-token-0123456789" not in log
    assert log.count("***") == 2
    assert stat.S_IMODE(server.log_path.stat().st_mode) == 0o600


def test_a_server_log_that_is_a_link_is_refused(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "server.log").symlink_to(outside)
    server = ServerProcess(0, "127.0.0.1", [1, 2], [sys.executable, "-c", "print(1)"], tmp_path / "logs" / "server.log")
    with pytest.raises(LaunchError, match="symbolic link"):
        server.start({})
    assert outside.read_text() == "keep me\n"


def test_a_server_gets_its_own_variables_and_they_are_in_its_log(tmp_path):
    program = "import os; print('sees', os.environ['SERVER_SLOT'], os.environ['SHARED'])"
    server = ServerProcess(3, "127.0.0.1", [1], [sys.executable, "-c", program], tmp_path / "server.log",
                           "python -c ...", env={"SERVER_SLOT": "3"})
    server.start({**os.environ, "SHARED": "yes"})
    server.proc.wait(timeout=30)
    server.finish()
    log = server.log_path.read_text()
    assert "sees 3 yes" in log and "# scaffold: starting server 3: SERVER_SLOT=3 python -c ..." in log


class ToyOptions(LaunchOptions):
    managed_flags = {"--port": "the worker's port range"}


def test_launch_options_name_the_bad_key_and_the_flag_scaffold_sets():
    with pytest.raises(ValueError, match="--port is set by scaffold; use the worker's port range instead"):
        parse_launch_options({"model_path": "m", "extra_args": ["--port=5"]}, ToyOptions)
    with pytest.raises(ValueError, match="engine.launch.cuont: unknown key; allowed: model_path, count"):
        parse_launch_options({"model_path": "m", "cuont": 2}, ToyOptions)
    with pytest.raises(ValueError, match="engine.launch.model_path: required"):
        parse_launch_options({}, ToyOptions)
    options = parse_launch_options({"model_path": "m", "host": "[fe80::1%25eth0]"}, ToyOptions)
    assert options.host == "fe80::1%eth0"  # raw: bracketed (and %25-encoded) only in URLs
