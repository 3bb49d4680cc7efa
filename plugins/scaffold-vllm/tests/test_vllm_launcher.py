"""The launcher, through the engine, starting the protocol test server with the very same code path as `vllm serve`.

``engine.launch.command`` replaces ``python -m vllm.entrypoints.cli.main serve`` by the test server script;
everything else (ports, the argument list, the environment, process groups, logs, readiness, stopping) is what a
real launch does. The test server binds its HTTP port and the ``VLLM_PORT`` it is given, as vLLM does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import ipaddress
import socket
from pathlib import Path

import pytest
from scaffold_remote.launcher import Launcher, live_servers, parse_launch_options
from scaffold_testkit.remote_server import start_failure
from scaffold_vllm import VLLMEngine
from scaffold_vllm.launcher import VLLMLaunchOptions, VLLMServer
from vllm_testkit import BYTE_VOCAB, SERVER_COMMAND, free_port_range, pid_alive, req, run

from scaffold_core.distributed.net import has_ipv6
from scaffold_core.distributed.ports import rank_slice
from scaffold_core.engine import RunInfo
from scaffold_core.errors import MissingDependencyError


def launched_engine(tmp_path: Path, *server_args: str, count: int = 1, port_range=None, rank: int = 0,
                    world: int = 1, local_rank: int = 0, host: str = "127.0.0.1", setup_timeout: float = 30.0,
                    **launch) -> VLLMEngine:
    eng = VLLMEngine(
        launch={"model_path": "test-model", "count": count, "host": host, "command": SERVER_COMMAND,
                "extra_args": [*BYTE_VOCAB, *server_args], "stop_timeout": 5.0, **launch},
        tokenizer="builtin:byte", setup_timeout=setup_timeout, retry_backoff=0.05)
    eng.attach_run(RunInfo(output_dir=tmp_path, rank=rank, world_size=world, local_rank=local_rank,
                           port_range=port_range or free_port_range()))
    return eng


def flags(argv: list[str]) -> dict[str, str]:
    start = len(SERVER_COMMAND) + 1  # after the model
    return dict(zip(argv[start::2], argv[start + 1::2]))


def test_launch_two_servers_generate_update_and_stop(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    slice_ = free_port_range(64)
    eng = launched_engine(tmp_path, count=2, port_range=slice_, tp=2)
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()

    async def main():
        async with eng:
            servers = eng.launched
            results = await asyncio.gather(*(eng.generate(req(i, max_tokens=4)) for i in range(6)))
            await eng.update_weights(checkpoint)  # the worker extension the launcher names loads it
            return servers, results, eng.server_urls

    servers, results, urls = run(main())
    ports = [p for s in servers for p in s.ports]
    assert len(set(ports)) == 4 and all(slice_[0] <= p <= slice_[1] for p in ports)
    assert urls == [f"http://127.0.0.1:{s.port}" for s in servers] and all(r.output_ids for r in results)
    for i, server in enumerate(servers):
        assert server.argv[:len(SERVER_COMMAND) + 1] == [*SERVER_COMMAND, "test-model"]
        f = flags(server.argv)
        assert f["--host"] == "127.0.0.1" and f["--port"] == str(server.port) and f["--tensor-parallel-size"] == "2"
        assert f["--worker-extension-cls"] == "scaffold_vllm.worker_extension.WeightLoader"
        assert server.env == {"VLLM_PORT": str(server.ports[1]), "VLLM_SERVER_DEV_MODE": "1",
                              "CUDA_VISIBLE_DEVICES": f"{2 * i},{2 * i + 1}"}  # each server its own GPUs
        log = (tmp_path / "vllm" / f"server-r0-{i}.log").read_text()
        assert f"VLLM_PORT {server.ports[1]}" in log and f"port {server.port}" in log and "dev mode True" in log
        assert not pid_alive(server.pid)  # stopped on close
    assert not live_servers()


def test_ports_never_overlap_across_8_workers_launching_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    job_range = free_port_range(256)
    engines = [launched_engine(tmp_path / f"w{r}", rank=r, world=8, local_rank=r,
                               port_range=rank_slice(r, 8, job_range)) for r in range(8)]

    async def main():
        await asyncio.gather(*(e.start() for e in engines))  # all reserve and launch at the same moment
        try:
            ports = [[tuple(s.ports) for s in e.launched] for e in engines]
            gpus = [e.launched[0].env["CUDA_VISIBLE_DEVICES"] for e in engines]
            outs = await asyncio.gather(*(e.generate(req(i, max_tokens=3)) for i, e in enumerate(engines)))
            return ports, gpus, outs
        finally:
            await asyncio.gather(*(e.close() for e in engines))

    ports, gpus, outs = run(main(), timeout=120)
    flat = [p for worker in ports for pair in worker for p in pair]
    assert len(flat) == 16 and len(set(flat)) == 16  # HTTP and VLLM_PORT of every server distinct (all bound)
    for r, worker in enumerate(ports):
        lo, hi = rank_slice(r, 8, job_range)
        assert all(lo <= p <= hi for pair in worker for p in pair)  # each worker stays in its own slice
    assert gpus == [str(r) for r in range(8)] and all(o.output_ids for o in outs)


def test_gpus_are_taken_from_the_launchers_own_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    options = parse_launch_options({"model_path": "m", "count": 2, "tp": 2}, VLLMLaunchOptions)
    launcher = Launcher(options, VLLMServer(), port_range=(20000, 20063), log_dir=Path("/unused"))
    assert [VLLMServer().env(options, i, [1, 2], launcher.gpus(i))["CUDA_VISIBLE_DEVICES"] for i in range(2)] \
        == ["4,5", "6,7"]
    mine = parse_launch_options({"model_path": "m", "env": {"CUDA_VISIBLE_DEVICES": "3"}}, VLLMLaunchOptions)
    assert mine.env == {"CUDA_VISIBLE_DEVICES": "3"}  # engine.launch.env wins over the assignment


@pytest.mark.skipif(not has_ipv6(), reason="no IPv6 on this host")
def test_ipv6_host_is_passed_raw_and_bracketed_in_urls(tmp_path):
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback")
    eng = launched_engine(tmp_path, host="[::1]")

    async def main():
        async with eng:
            return eng.launched[0], await eng.generate(req())

    server, result = run(main())
    assert flags(server.argv)["--host"] == "::1"
    assert server.url == f"http://[::1]:{server.port}" and result.meta["server"] == server.url


def test_a_zone_id_is_passed_raw_to_the_server_and_percent_encoded_in_its_url():
    options = parse_launch_options({"model_path": "m", "host": "fe80::1%eth0"}, VLLMLaunchOptions)
    argv = VLLMServer().argv(options, ["vllm", "serve"], 0, options.host, [8000, 8001], [0], None)
    assert argv[argv.index("--host") + 1] == "fe80::1%eth0"  # what the server's socket calls need
    launcher = Launcher(options, VLLMServer(), port_range=(20000, 20063), log_dir=Path("/unused"))
    from scaffold_remote.launcher import ServerProcess

    server = ServerProcess(0, options.host, [8000, 8001], argv, Path("/unused"), name=launcher.name)
    assert server.url == "http://[fe80::1%25eth0]:8000"  # RFC 6874
    assert VLLMEngine(url=server.url).urls == [server.url]


def _link_local() -> str | None:
    """A link-local address of this host that can be bound, with its zone (``fe80::...%eth0``), else None."""
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) == 6 and fields[0].startswith("fe80"):
            address = f"{ipaddress.IPv6Address(bytes.fromhex(fields[0]))}%{fields[5]}"
            try:
                socket.create_server((address, 0), family=socket.AF_INET6).close()
                return address
            except OSError:
                continue
    return None


@pytest.mark.skipif(_link_local() is None, reason="no bindable link-local IPv6 address on this host")
def test_a_server_on_a_link_local_address_with_a_zone_id_serves(tmp_path):
    eng = launched_engine(tmp_path, host=_link_local())

    async def main():
        async with eng:
            return eng.launched[0], await eng.generate(req())

    server, result = run(main())
    assert "%25" in server.url and result.meta["server"] == server.url and result.output_ids


def test_a_server_that_never_becomes_ready_fails_within_setup_timeout_with_its_log(tmp_path):
    error, took = start_failure(launched_engine(tmp_path, "--never-ready", setup_timeout=5.0))
    message = str(error)
    assert "1 vllm server(s) not ready within setup_timeout=5 s" in message and "HTTP 503" in message
    assert "test server: listening on" in message  # the tail of the server's log
    assert took < 5.0 + 8.0 and not live_servers()


def test_a_server_that_crashes_fails_at_once_with_its_log(tmp_path):
    error, took = start_failure(launched_engine(tmp_path, "--crash-after-load", setup_timeout=60))
    assert "vllm server 0" in str(error) and "exited with code 1 before it was ready" in str(error)
    assert "CUDA out of memory" in str(error) and took < 20


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_vllm_says_how_to_install_it(tmp_path):
    eng = VLLMEngine(launch={"model_path": "m"}, tokenizer="builtin:byte")
    eng.attach_run(RunInfo(output_dir=tmp_path, port_range=free_port_range()))
    with pytest.raises(MissingDependencyError, match=r'pip install "scaffold-vllm\[server\]"'):
        run(eng.start())
    assert not (tmp_path / "vllm").exists()


def test_the_launch_command_is_vllm_serve_with_what_scaffold_assigns(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    options = parse_launch_options({"model_path": "Qwen/Qwen3-0.6B", "tp": 2, "use_api_key": True,
                                    "extra_args": ["--max-model-len", "4096"]}, VLLMLaunchOptions)
    argv = VLLMServer(weight_transfer="disk").argv(options, ["python", "-m", "vllm.entrypoints.cli.main", "serve"],
                                                   1, "127.0.0.1", [21000, 21001], [2, 3], "key")
    assert argv == ["python", "-m", "vllm.entrypoints.cli.main", "serve", "Qwen/Qwen3-0.6B", "--host", "127.0.0.1",
                    "--port", "21000", "--tensor-parallel-size", "2", "--worker-extension-cls",
                    "scaffold_vllm.worker_extension.WeightLoader", "--weight-transfer-config", '{"backend": "disk"}',
                    "--api-key", "key", "--max-model-len", "4096"]
    for flag in ("--port", "--host", "--tensor-parallel-size", "-tp", "--api-key", "--model"):
        with pytest.raises(ValueError, match=f"{flag} is set by scaffold"):
            VLLMEngine(launch={"model_path": "m", "extra_args": [flag, "1"]})
