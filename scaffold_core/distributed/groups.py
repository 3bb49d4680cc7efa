"""torch.distributed process groups: torchrun-style set-up, a Gloo CPU group, bounded collectives.

:func:`init_process_group` initialises the default group from torchrun's
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) or from explicit arguments. The rendezvous URL is built
with :func:`scaffold_core.distributed.net.torch_tcp_url`, so ``MASTER_ADDR=::1`` (or
``[::1]``) gives ``tcp://[::1]:PORT`` (and a link-local ``fe80::1%eth0`` keeps its zone id raw, as
torch's parser needs). Next to the default group it always
creates a Gloo group on the same ranks: the **CPU group**. CPU-side metadata
collectives (micro-batch counts, object gathers, barriers) use it, never an
NCCL WORLD group, which needs the right CUDA device and working inter-node
routing just to agree on a few integers.

Every rendezvous and collective is bounded by ``timeout_s``; a rank that
never arrives turns into a :class:`DistributedError` naming the URL, the
rank and the fix, not a hang. torch is imported inside the functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import DistributedError
from .env import DistEnv
from .net import split_hostport, strip_brackets, torch_tcp_url

DEFAULT_TIMEOUT_S = 300.0


@dataclass
class ProcessGroups:
    """The default group (``None`` means torch's WORLD) and the Gloo CPU group beside it."""

    rank: int
    world_size: int
    backend: str
    cpu_group: Any
    timeout_s: float
    init_method: str | None = None
    owned: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def barrier(self, timeout_s: float | None = None) -> None:
        """Wait for every rank (Gloo, bounded); the error names the ranks that did not arrive."""
        barrier(self.cpu_group, timeout_s=timeout_s or self.timeout_s)

    def destroy(self) -> None:
        """Destroy the groups (if this object created them)."""
        global _CURRENT
        if _CURRENT is self:
            _CURRENT = None
        if not self.owned:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def __enter__(self) -> ProcessGroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


_CURRENT: ProcessGroups | None = None


def current() -> ProcessGroups | None:
    """The groups :func:`init_process_group` set up in this process, if any."""
    return _CURRENT


def _timedelta(seconds: float) -> Any:
    import datetime

    if not seconds or seconds <= 0:
        raise DistributedError(f"timeout must be > 0 seconds, got {seconds!r}")
    return datetime.timedelta(seconds=float(seconds))


def normalize_init_method(init_method: str, environ: Mapping[str, str] | None = None) -> str:
    """A rendezvous URL torch understands: ``env://`` becomes ``tcp://`` from MASTER_ADDR/PORT and IPv6
    hosts are bracketed exactly once (``tcp://[::1]:29500``)."""
    text = init_method.strip()
    if text == "env://":
        return DistEnv.from_env(environ).init_method
    if text.startswith("tcp://"):
        host, port = split_hostport(text)
        return torch_tcp_url(host, port)
    return text  # file:// and anything else torch supports, unchanged


def init_process_group(backend: str | None = None, *, init_method: str | None = None, rank: int | None = None,
                       world_size: int | None = None, master_addr: str | None = None,
                       master_port: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                       environ: Mapping[str, str] | None = None) -> ProcessGroups:
    """Initialise torch.distributed and create the Gloo CPU group beside it.

    Explicit arguments win over torchrun's variables. ``backend`` defaults to
    ``nccl`` when CUDA is available, else ``gloo``. If torch.distributed is
    already initialised (by a trainer), only the CPU group is created. Every
    wait is bounded by ``timeout_s``.
    """
    global _CURRENT
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedError("this torch build has no torch.distributed support")
    timeout = _timedelta(timeout_s)
    if dist.is_initialized():
        cpu = _new_gloo_group(dist, timeout)
        _CURRENT = ProcessGroups(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()), cpu, timeout_s,
                                 owned=False)
        return _CURRENT
    env = DistEnv.from_env(environ)
    rank = env.rank if rank is None else rank
    world_size = env.world_size if world_size is None else world_size
    if init_method is None:
        addr = strip_brackets(master_addr) if master_addr else env.master_addr
        port = master_port if master_port is not None else env.master_port
        url = DistEnv(rank, world_size, 0, 1, addr, port).init_method
    else:
        url = normalize_init_method(init_method, environ)
    if not 0 <= rank < world_size:
        raise DistributedError(f"rank {rank} is not in [0, world_size={world_size})")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    try:
        dist.init_process_group(backend=backend, init_method=url, rank=rank, world_size=world_size,
                                timeout=timeout)
    except Exception as exc:
        raise DistributedError(
            f"rank {rank} of {world_size}: rendezvous at {url} ({backend}) failed within {timeout_s:g} s: "
            f"{type(exc).__name__}: {exc}. Check that every rank started, that MASTER_ADDR is an address of "
            "rank 0's machine reachable from here, and that MASTER_PORT is free there") from exc
    try:
        cpu = _new_gloo_group(dist, timeout)
    except Exception:
        dist.destroy_process_group()
        raise
    _CURRENT = ProcessGroups(rank, world_size, backend, cpu, timeout_s, init_method=url)
    return _CURRENT


def _new_gloo_group(dist: Any, timeout: Any) -> Any:
    try:
        return dist.new_group(backend="gloo", timeout=timeout)
    except Exception as exc:
        raise DistributedError(f"creating the Gloo CPU group failed: {type(exc).__name__}: {exc}") from exc


def resolve_cpu_group(group: Any = None) -> tuple[Any, int]:
    """(group, world size) for a CPU-side metadata collective.

    An explicit ``group`` is used as given. Otherwise: the CPU group of
    :func:`init_process_group`; torch's WORLD only when its backend is Gloo;
    world size 1 (no collective at all) when torch.distributed is not
    initialised. A non-Gloo WORLD is refused: pass a Gloo group.
    """
    if group is not None:
        import torch.distributed as dist

        return group, dist.get_world_size(group)
    if _CURRENT is not None:
        return _CURRENT.cpu_group, _CURRENT.world_size
    try:
        import torch.distributed as dist
    except ImportError:
        return None, 1
    if not dist.is_available() or not dist.is_initialized():
        return None, 1
    backend = str(dist.get_backend())
    if backend != "gloo":
        raise DistributedError(
            f"a CPU-side collective needs a Gloo group, and the default group's backend is {backend!r}: pass "
            "group=<a gloo group> (dist.new_group(backend='gloo')), or set up with "
            "scaffold_core.distributed.init_process_group(), which creates one")
    return None, dist.get_world_size()


def _run(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except DistributedError:
        raise
    except Exception as exc:
        raise DistributedError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


def _all_reduce_scalar(value: float, op_name: str, dtype_name: str, group: Any) -> float:
    group, world = resolve_cpu_group(group)
    if world == 1:
        return value
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=getattr(torch, dtype_name))
    _run(f"all_reduce({op_name}) on the CPU group", dist.all_reduce, tensor, op=getattr(dist.ReduceOp, op_name),
         group=group)
    return tensor.item()


def all_reduce_max(value: int, group: Any = None) -> int:
    """The maximum of ``value`` over the ranks of the (Gloo) group."""
    return int(_all_reduce_scalar(int(value), "MAX", "int64", group))


def all_reduce_sum(value: float, group: Any = None) -> float:
    """The sum of ``value`` over the ranks of the (Gloo) group."""
    return float(_all_reduce_scalar(float(value), "SUM", "float64", group))


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, over the Gloo group."""
    group, world = resolve_cpu_group(group)
    if world == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world
    _run("all_gather_object on the CPU group", dist.all_gather_object, out, obj, group=group)
    return out


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """``obj`` from rank ``src`` on every rank, over the Gloo group."""
    group, world = resolve_cpu_group(group)
    if world == 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    _run("broadcast_object_list on the CPU group", dist.broadcast_object_list, box, src=src, group=group)
    return box[0]


def barrier(group: Any = None, *, timeout_s: float | None = None) -> None:
    """Wait for every rank, bounded; on Gloo the error names the ranks that did not arrive."""
    group, world = resolve_cpu_group(group)
    if world == 1:
        return
    import torch.distributed as dist

    timeout = _timedelta(timeout_s or (_CURRENT.timeout_s if _CURRENT else DEFAULT_TIMEOUT_S))
    _run("barrier on the CPU group", dist.monitored_barrier, group=group, timeout=timeout, wait_all_ranks=True)


def destroy_process_group() -> None:
    """Destroy what :func:`init_process_group` created (no-op when nothing is set up)."""
    if _CURRENT is not None:
        _CURRENT.destroy()
