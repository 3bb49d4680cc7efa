"""The launcher, through the engine, starting the protocol test server with the very same code path as sglang.

``engine.launch.command`` replaces ``python -m sglang.launch_server`` by the
test server script; everything else (ports, argument list, process group,
logs, readiness, stopping) is what a real launch does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from scaffold_remote.launcher import LaunchError, live_servers
from scaffold_testkit.remote_server import start_failure
from sglang_testkit import SERVER_COMMAND, free_port_range, pid_alive, run

from scaffold_core.distributed.net import has_ipv6
from scaffold_core.distributed.ports import rank_slice
from scaffold_core.engine import RunInfo
from scaffold_core.errors import MissingDependencyError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_sglang import SGLangEngine

BYTE_VOCAB = ["--vocab-size", "262"]  # token ids the byte tokenizer can decode


def launched_engine(tmp_path: Path, *server_args: str, count: int = 1, port_range=None, rank: int = 0,
                    world: int = 1, host: str = "127.0.0.1", setup_timeout: float = 30.0, **launch) -> SGLangEngine:
    eng = SGLangEngine(
        launch={"model_path": "test-model", "count": count, "host": host, "command": SERVER_COMMAND,
                "extra_args": [*BYTE_VOCAB, *server_args], "stop_timeout": 5.0, **launch},
        tokenizer="builtin:byte", setup_timeout=setup_timeout, retry_backoff=0.05)
    eng.attach_run(RunInfo(output_dir=tmp_path, rank=rank, world_size=world,
                           port_range=port_range or free_port_range()))
    return eng


def request(i: int = 0) -> GenerationRequest:
    return GenerationRequest(f"r{i}", [50, 51, 52 + i], SamplingParams(max_tokens=4, temperature=0), episode_id=f"e{i}")


def test_launch_two_servers_generate_and_stop(tmp_path):
    slice_ = free_port_range(64)
    eng = launched_engine(tmp_path, count=2, port_range=slice_)

    async def main():
        async with eng:
            servers = eng.launched
            results = await asyncio.gather(*(eng.generate(request(i)) for i in range(6)))
            return servers, results, eng.server_urls

    servers, results, urls = run(main())
    ports = [p for s in servers for p in s.ports]
    assert len(set(ports)) == 4 and all(slice_[0] <= p <= slice_[1] for p in ports)
    assert urls == [f"http://127.0.0.1:{s.port}" for s in servers]
    assert {r.meta["server"] for r in results} <= set(urls) and all(r.output_ids for r in results)
    for i, server in enumerate(servers):
        argv = server.argv
        assert argv[: len(SERVER_COMMAND)] == SERVER_COMMAND
        flags = dict(zip(argv[len(SERVER_COMMAND)::2], argv[len(SERVER_COMMAND) + 1::2]))
        assert flags["--model-path"] == "test-model" and flags["--host"] == "127.0.0.1"
        assert flags["--port"] == str(server.port) and flags["--nccl-port"] == str(server.ports[1])
        assert flags["--tp-size"] == "1" and flags["--base-gpu-id"] == str(i)
        log = (tmp_path / "sglang" / f"server-r0-{i}.log").read_text()
        assert "# scaffold: starting server" in log and f"port {server.port}" in log
        assert not pid_alive(server.pid)  # stopped on close
    assert not live_servers()


def test_two_workers_launching_at_once_never_collide(tmp_path):
    job_range = free_port_range(128)
    engines = [launched_engine(tmp_path / f"w{r}", count=2, rank=r, world=2, port_range=rank_slice(r, 2, job_range))
               for r in range(2)]

    async def main():
        await asyncio.gather(*(e.start() for e in engines))  # both reserve and launch concurrently
        try:
            ports = [[tuple(s.ports) for s in e.launched] for e in engines]
            outs = await asyncio.gather(*(e.generate(request(i)) for i, e in enumerate(engines)))
            return ports, outs
        finally:
            await asyncio.gather(*(e.close() for e in engines))

    ports, outs = run(main())
    flat = [p for worker in ports for pair in worker for p in pair]
    assert len(set(flat)) == 8  # every server's HTTP and NCCL port distinct (the test server binds both)
    for r, worker in enumerate(ports):
        lo, hi = rank_slice(r, 2, job_range)
        assert all(lo <= p <= hi for pair in worker for p in pair)  # each worker stays in its own slice
    assert all(o.output_ids for o in outs)


def test_a_server_that_never_becomes_ready_fails_within_setup_timeout_with_its_log(tmp_path):
    error, took = start_failure(launched_engine(tmp_path, "--never-ready", setup_timeout=5.0))
    message = str(error)
    assert "not ready within setup_timeout=5 s" in message and "HTTP 503" in message
    assert "test server: listening on" in message  # the tail of the server's log
    assert took < 5.0 + 8.0
    assert not live_servers()


def test_a_server_that_crashes_fails_at_once_with_its_log(tmp_path):
    error, took = start_failure(launched_engine(tmp_path, "--crash-after-load", setup_timeout=60))
    assert "exited with code 1 before it was ready" in str(error) and "CUDA out of memory" in str(error)
    assert took < 20


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_missing_sglang_says_how_to_install_it(tmp_path):
    eng = SGLangEngine(launch={"model_path": "m"}, tokenizer="builtin:byte")
    eng.attach_run(RunInfo(output_dir=tmp_path, port_range=free_port_range()))
    with pytest.raises(MissingDependencyError, match=r'pip install "scaffold-sglang\[server\]"'):
        run(eng.start())
    assert not (tmp_path / "sglang").exists()


@pytest.mark.skipif(not has_ipv6(), reason="no IPv6 on this host")
def test_ipv6_host_is_passed_raw_and_bracketed_in_urls(tmp_path):
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback")
    eng = launched_engine(tmp_path, host="[::1]")

    async def main():
        async with eng:
            return eng.launched[0], await eng.generate(request())

    server, result = run(main())
    assert server.argv[server.argv.index("--host") + 1] == "::1"
    assert server.url == f"http://[::1]:{server.port}" and result.meta["server"] == server.url


def test_a_port_taken_before_the_server_binds_it_is_replaced(tmp_path):
    eng = launched_engine(tmp_path, "--load-delay", "0.8")

    async def main():
        task = asyncio.ensure_future(eng.start())
        while not eng.launched:
            await asyncio.sleep(0.005)
        first = eng.launched[0].port
        thief = socket.socket()
        thief.bind(("127.0.0.1", first))  # someone else grabs the port while the server loads
        thief.listen()
        try:
            await task
            second = eng.launched[0].port
            result = await eng.generate(request())
        finally:
            thief.close()
            await eng.close()
        return first, second, result

    first, second, result = run(main())
    assert first != second and result.output_ids


def test_extra_args_cannot_override_what_scaffold_assigns():
    for flag in ("--port", "--nccl-port", "--host", "--tp-size", "--model-path", "--api-key"):
        with pytest.raises(ValueError, match=f"{flag} is set by scaffold"):
            SGLangEngine(launch={"model_path": "m", "extra_args": [flag, "1"]})


def test_api_key_is_passed_to_launched_servers_and_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_API_KEY", "launch-secret")
    eng = launched_engine(tmp_path, use_api_key=True)

    async def main():
        async with eng:
            return eng.launched[0], await eng.generate(request())

    server, result = run(main())
    assert result.output_ids and "--api-key" in server.argv
    log = server.log_path.read_text()
    assert "launch-secret" not in log and "--api-key '***'" in log


# -- no process left behind: Ctrl-C, a killed parent, a failing test --------------------------

SCRIPT = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    from sglang_testkit import SERVER_COMMAND
    from scaffold_core.engine import RunInfo
    from scaffold_sglang import SGLangEngine

    eng = SGLangEngine(launch={{"model_path": "m", "command": SERVER_COMMAND,
                               "extra_args": ["--pid-file", {pid_file!r}, "--never-ready"]}},
                       tokenizer="builtin:byte", setup_timeout=600)
    eng.attach_run(RunInfo(output_dir={out!r}, port_range=({lo}, {hi})))
    asyncio.run(eng.start())
""")


def _start_script(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    pid_file = tmp_path / "server.pid"
    lo, hi = free_port_range()
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent), pid_file=str(pid_file), out=str(tmp_path),
                                    lo=lo, hi=hi))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the launch script did not start a server: {proc.communicate()[0]!r}")
        time.sleep(0.05)
    return proc, pid_file


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "parent-killed"])
def test_servers_die_with_an_interrupted_or_killed_launcher(tmp_path, sig):
    proc, pid_file = _start_script(tmp_path)
    server_pid = int(pid_file.read_text())
    try:
        assert pid_alive(server_pid)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert _wait_gone(server_pid, 10), "the server outlived the process that launched it"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid_alive(server_pid):
            os.killpg(server_pid, signal.SIGKILL)


FAILING_TEST = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    from sglang_testkit import SERVER_COMMAND
    from scaffold_core.engine import RunInfo
    from scaffold_sglang import SGLangEngine

    def test_that_fails_without_closing_its_engine():
        eng = SGLangEngine(launch={{"model_path": "m", "command": SERVER_COMMAND,
                                   "extra_args": ["--pid-file", {pid_file!r}, "--vocab-size", "262"]}},
                           tokenizer="builtin:byte")
        eng.attach_run(RunInfo(output_dir={out!r}, port_range=({lo}, {hi})))
        asyncio.run(eng.start())
        assert False, "this test fails with its server running"
""")


def test_a_failing_test_leaves_no_server_behind(tmp_path):
    pid_file = tmp_path / "server.pid"
    lo, hi = free_port_range()
    test_file = tmp_path / "test_fails.py"
    test_file.write_text(FAILING_TEST.format(tests=str(Path(__file__).parent), pid_file=str(pid_file),
                                             out=str(tmp_path), lo=lo, hi=hi))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1 and "this test fails with its server running" in done.stdout
    server_pid = int(pid_file.read_text())
    assert _wait_gone(server_pid, 10)


def test_a_tokenizer_that_cannot_load_fails_the_start_without_waiting_for_the_servers(tmp_path):
    from scaffold_core.errors import ConfigError

    eng = launched_engine(tmp_path, "--never-ready", setup_timeout=120)
    eng.tokenizer_name = str(tmp_path / "no-such-tokenizer.gguf")

    async def main():
        started = time.monotonic()
        with pytest.raises(ConfigError, match="engine.tokenizer: GGUF file .* does not exist"):
            await eng.start()
        return time.monotonic() - started

    assert run(main()) < 30
    assert not live_servers()


def test_a_command_that_does_not_exist_is_a_launch_error(tmp_path):
    eng = SGLangEngine(launch={"model_path": "m", "command": [str(tmp_path / "no-such-python")]},
                       tokenizer="builtin:byte")
    eng.attach_run(RunInfo(output_dir=tmp_path, port_range=free_port_range()))
    with pytest.raises(LaunchError, match="cannot start sglang server 0"):
        run(eng.start())
    assert not live_servers()
