"""Process groups: torchrun env, tcp://[v6] rendezvous, the Gloo CPU group, bounded collectives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scaffold_core import distributed
from scaffold_core.distributed import DistEnv, DistributedError
from scaffold_core.distributed.net import has_ipv6
from scaffold_core.distributed.ports import control_port_range, reserve_port

RANK_SCRIPT = Path(__file__).with_name("distributed_rank.py")


def test_dist_env_reads_torchrun_variables():
    env = DistEnv.from_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                            "MASTER_ADDR": "[fd00::5]", "MASTER_PORT": "29500"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 8, 1, 2)
    assert env.master_addr == "fd00::5" and env.launched
    assert env.init_method == "tcp://[fd00::5]:29500"
    assert env.to_env()["GROUP_RANK"] == "1" and env.to_env()["MASTER_ADDR"] == "fd00::5"
    single = DistEnv.from_env({})
    assert (single.rank, single.world_size, single.launched) == (0, 1, False)


@pytest.mark.parametrize("environ, problem", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, r"RANK 2 is not in \[0, WORLD_SIZE=2\)"),
    ({"RANK": "0"}, "WORLD_SIZE is not set"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"}, "MASTER_PORT must be in"),
])
def test_dist_env_errors_name_the_variable(environ, problem):
    with pytest.raises(DistributedError, match=problem):
        DistEnv.from_env(environ)


def test_init_methods_are_normalized_for_ipv6():
    env = {"MASTER_ADDR": "::1", "MASTER_PORT": "29501"}
    assert distributed.normalize_init_method("env://", env) == "tcp://[::1]:29501"
    assert distributed.normalize_init_method("tcp://[::1]:29501") == "tcp://[::1]:29501"
    assert distributed.normalize_init_method("file:///tmp/x") == "file:///tmp/x"
    with pytest.raises(DistributedError, match="MASTER_PORT is not set"):
        distributed.normalize_init_method("env://", {"MASTER_ADDR": "::1"})


def test_cpu_collectives_without_a_process_group_are_local():
    assert distributed.resolve_cpu_group() == (None, 1)
    assert distributed.all_reduce_max(7) == 7
    assert distributed.all_gather_objects("x") == ["x"]
    assert distributed.broadcast_object({"a": 1}) == {"a": 1}


def test_an_nccl_world_group_is_refused_for_cpu_metadata(monkeypatch):
    dist = pytest.importorskip("torch.distributed")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    with pytest.raises(DistributedError, match="needs a Gloo group.*'nccl'"):
        distributed.all_reduce_max(3)


def _run_ranks(world: int, init_method: str, mode: str, timeout: float = 120) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, str(RANK_SCRIPT), str(r), str(world), init_method, mode],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for r in range(world)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err[-3000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return outs


@pytest.mark.slow
def test_a_group_of_4_over_ipv6_loopback_reduces_and_syncs_micro_batch_counts():
    if not has_ipv6():
        pytest.skip("this host has no IPv6")
    port = reserve_port(host="::1", port_range=control_port_range()).release()
    outs = _run_ranks(4, f"tcp://[::1]:{port}", "collectives")
    assert [o["sum"] for o in outs] == [10.0] * 4  # 1 + 2 + 3 + 4 over the default group
    assert {o["cpu_backend"] for o in outs} == {"gloo"}
    assert {o["url"] for o in outs} == {f"tcp://[::1]:{port}"}
    assert len({o["local_min"] for o in outs}) > 1, "the ranks' data should need different counts"
    assert {o["count"] for o in outs} == {max(o["local_min"] for o in outs)}  # equal counts everywhere
    assert all(o["rows"] == o["n"] for o in outs)  # every sequence in exactly one micro-batch
    assert all(o["smallest"] >= 1 for o in outs)  # no empty micro-batch on any rank
    # A rank with too few sequences: every rank raises the same clear error (none is left waiting).
    assert len({o["short_error"] for o in outs}) == 1
    error = outs[0]["short_error"]
    assert "rank 0 holds only 2 sequences" in error and "minimum sequences per rank" in error
    assert all(o["gathered"] == [0, 1, 2, 3] for o in outs)


@pytest.mark.slow
def test_a_rank_that_never_arrives_is_an_error_within_the_timeout_not_a_hang():
    port = reserve_port(host="127.0.0.1", port_range=control_port_range()).release()
    # Only rank 0 of 2 starts.
    proc = subprocess.run([sys.executable, str(RANK_SCRIPT), "0", "2", f"tcp://127.0.0.1:{port}",
                           "rendezvous-timeout"], capture_output=True, text=True, timeout=120)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] and "rank 0 of 2" in out["error"] and "every rank started" in out["error"]
    assert out["seconds"] < 60
