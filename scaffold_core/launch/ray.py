"""``rollout.launcher: ray``: the same workers as Ray actors, for runs that outgrow one machine.

``ray.init(address=rollout.ray_address)`` joins an existing cluster (``null``
starts a local Ray instance, stopped again at the end). Each of the
``rollout.workers`` actors (``rollout.ray_num_cpus`` / ``ray_num_gpus``
each) sets torchrun's variables (ranks, local ranks per node, rank 0's
address as ``MASTER_ADDR`` and a port from its control range as
``MASTER_PORT``) and runs its shard exactly like a local worker process
(:func:`scaffold_core.launch.worker.run_shard`). Plugins must be installed on every
node; ``SCAFFOLD_*`` variables of the driver are passed to the actors.

The output directory should be on a file system every node shares. When an
actor's store (``episodes.rank-NNNNN.db``, closed when its shard ends) is not
visible from the driver, the driver copies it from the actor after the run, so
nothing is lost either way. A failed actor is
reported by rank and shard like a failed worker process; every wait is
bounded (``rollout.ray_startup_timeout`` for placing the actors,
``rollout.worker_timeout`` for the run); actors still running then, or at
Ctrl-C, are killed, and their stores keep what they finished. ``ray`` is an optional extra:
``pip install "scaffold-core[ray]"``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Config, load_config
from ..distributed.env import DistEnv
from ..distributed.net import host_ip
from ..distributed.ports import control_port_range, reserve_port
from ..errors import ScaffoldError, require_module
from ..output import RunOutput, expand_output_dir, rank_store_name
from ..output.files import atomic_writer
from ..run.summary import ExitCode, report_failures
from .results import WorkerResult, finalize_run
from .worker import run_shard

CHUNK = 8 << 20
POLL_S = 0.5


def require_ray() -> Any:
    """The ray module, or a MissingDependencyError naming the install command."""
    return require_module("ray", needed_by="rollout.launcher: ray", what="the ray package",
                          install='pip install "scaffold-core[ray]"')


class RayWorker:
    """The body of a worker actor (``ray.remote(RayWorker)``): one rank of the run."""

    def __init__(self, rank: int, env_vars: dict[str, str]):
        self.rank = rank
        os.environ.update(env_vars)

    def node(self) -> dict[str, Any]:
        """Where this actor runs: Ray node id, an address other nodes can reach, pid."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": host_ip(), "pid": os.getpid()}

    def rendezvous_port(self) -> int:
        """A free port of this node's control range (rank 0's actor is asked: it is ``MASTER_PORT``)."""
        return reserve_port(port_range=control_port_range()).release()

    def run(self, config_data: dict[str, Any], output_dir: str, resume: bool,
            dist_env: dict[str, Any]) -> dict[str, Any]:
        """Run this rank's shard; returns its live metrics and where its store is."""
        env = DistEnv(**dist_env, launched=True)
        os.environ.update(env.to_env())
        config = load_config(data=config_data)
        live = run_shard(config, Path(output_dir), env, resume=resume, progress=False)
        store = Path(output_dir) / rank_store_name(env.rank)
        return {"live": live, "store": str(store), "size": store.stat().st_size if store.exists() else 0}

    def read_chunk(self, path: str, offset: int, size: int) -> bytes:
        """Part of a file on this actor's node (the driver copies unshared stores with it)."""
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(size)


def _passed_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("SCAFFOLD_")}


def local_ranks(nodes: list[str]) -> list[tuple[int, int]]:
    """(local rank, local world size) of each rank, from the node each rank runs on."""
    counts: dict[str, int] = {}
    seen: dict[str, int] = {}
    for node in nodes:
        counts[node] = counts.get(node, 0) + 1
    out = []
    for node in nodes:
        out.append((seen.get(node, 0), counts[node]))
        seen[node] = seen.get(node, 0) + 1
    return out


def run_ray(config: Config, *, output_dir: str | Path | None = None, resume: bool = False,
            progress: bool | None = None, force_config: bool = False,
            on_head: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run ``config`` on ``rollout.workers`` Ray actors; returns the merged metrics."""
    ray = require_ray()
    began = time.perf_counter()
    # The config was validated when it loaded; this checks the directory (existing run, --resume, overwrite).
    output = RunOutput(Path(output_dir) if output_dir is not None else expand_output_dir(config),
                       resume=resume, overwrite=config.output.overwrite, config=config, force_config=force_config)
    try:  # the output directory's lock is held until the run's files are written
        return _run_ray(ray, config, output, began, progress, on_head)
    finally:
        output.release()


def _run_ray(ray: Any, config: Config, output: RunOutput, began: float, progress: bool | None,
             on_head: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    rcfg = config.rollout
    resume = output.resume
    directory = output.dir.resolve()
    output.write_config(config)
    print(f"scaffold: writing to {directory} with {rcfg.workers} Ray actors "
          f"({'local Ray' if rcfg.ray_address is None else rcfg.ray_address})", file=sys.stderr)
    started_ray = False
    if not ray.is_initialized():
        ray.init(address=rcfg.ray_address, include_dashboard=False, logging_level="WARNING",
                 configure_logging=False, log_to_driver=bool(progress))
        started_ray = True
    actors: list[Any] = []
    results: list[WorkerResult] = []
    interrupted: str | None = None
    try:
        actor_cls = ray.remote(RayWorker)
        env_vars = _passed_env()
        options: dict[str, Any] = {"num_cpus": rcfg.ray_num_cpus, "num_gpus": rcfg.ray_num_gpus}
        if env_vars:
            options["runtime_env"] = {"env_vars": env_vars}
        actors = [actor_cls.options(**options).remote(rank, env_vars) for rank in range(rcfg.workers)]
        try:
            nodes = ray.get([a.node.remote() for a in actors], timeout=rcfg.ray_startup_timeout)
        except ray.exceptions.GetTimeoutError:
            raise ScaffoldError(
                f"rollout.launcher ray: {rcfg.workers} actors with ray_num_cpus={rcfg.ray_num_cpus}, "
                f"ray_num_gpus={rcfg.ray_num_gpus} could not all start within rollout.ray_startup_timeout="
                f"{rcfg.ray_startup_timeout:g} s; the cluster has {ray.cluster_resources()}. Lower the workers "
                "or the per-actor resources, or add nodes") from None
        master_port = ray.get(actors[0].rendezvous_port.remote(), timeout=rcfg.ray_startup_timeout)
        placements = local_ranks([n["node_id"] for n in nodes])
        refs = {}
        for rank, actor in enumerate(actors):
            local_rank, local_world = placements[rank]
            dist_env = {"rank": rank, "world_size": rcfg.workers, "local_rank": local_rank,
                        "local_world_size": local_world, "master_addr": nodes[0]["host"], "master_port": master_port}
            refs[rank] = actor.run.remote(config.to_dict(), str(directory), resume, dist_env)
        interrupted = _wait(ray, refs, rcfg.worker_timeout)
        results = _collect(ray, refs, actors, directory, rcfg.workers, interrupted)
    finally:
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:
                pass
        if started_ray:
            ray.shutdown()
    metrics = finalize_run(config, directory, results, extra_live={"interrupted": interrupted} if interrupted else None,
                           launcher="ray", launcher_wall_s=time.perf_counter() - began, on_head=on_head)
    report_failures(metrics)
    return metrics


def _wait(ray: Any, refs: dict[int, Any], timeout_s: float) -> str | None:
    """Wait for every actor's run, bounded by ``timeout_s``; returns "SIGINT" on Ctrl-C.

    Actors still running afterwards are killed by the caller; their stores keep what finished.
    """
    deadline = time.monotonic() + timeout_s
    pending = list(refs.values())
    try:
        while pending and time.monotonic() < deadline:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(POLL_S, timeout_s))
    except KeyboardInterrupt:
        return "SIGINT"
    return None


def _collect(ray: Any, refs: dict[int, Any], actors: list[Any], directory: Path, world: int,
             interrupted: str | None) -> list[WorkerResult]:
    results = []
    for rank, ref in refs.items():
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            error = "interrupted" if interrupted else "timed out after rollout.worker_timeout"
            results.append(WorkerResult(rank, world, None, None, error))
            continue
        try:
            out = ray.get(ref, timeout=60)
        except Exception as exc:  # RayActorError, RayTaskError (the worker raised), TaskCancelledError
            text = str(exc)
            results.append(WorkerResult(rank, world, None, None, f"{type(exc).__name__}", log_tail=text[-4000:]))
            continue
        try:
            _fetch_store(ray, actors[rank], out["store"], int(out["size"]), directory)
        except Exception as exc:
            results.append(WorkerResult(rank, world, out["live"], None,
                                        f"could not copy its store from its node: {type(exc).__name__}: {exc}"))
            continue
        code = ExitCode.INTERRUPTED if out["live"].get("interrupted") else ExitCode.OK
        results.append(WorkerResult(rank, world, out["live"], code, None))
    return results


def _fetch_store(ray: Any, actor: Any, path: str, size: int, directory: Path) -> None:
    """Copy an actor's store to the driver when the driver cannot see it (no shared file system)."""
    local = directory / Path(path).name
    if local.exists() and local.stat().st_size >= size:
        return
    with atomic_writer(local, binary=True) as fh:  # a fresh temp name renamed into place: never through a link
        offset = 0
        while offset < size:
            chunk = ray.get(actor.read_chunk.remote(path, offset, min(CHUNK, size - offset)), timeout=300)
            if not chunk:
                break
            fh.write(chunk)
            offset += len(chunk)
