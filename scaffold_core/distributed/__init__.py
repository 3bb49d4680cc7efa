"""Networking and process groups: IPv6-safe addresses, per-worker port slices, torch.distributed groups.

``net`` (host/port formatting, this host's routable address), ``ports``
(disjoint per-rank port slices, ports reserved by binding), ``env``
(torchrun's variables as a :class:`DistEnv`) and ``groups`` (process groups
with a Gloo CPU group, bounded collectives). The process-group API is
importable from here: ``from scaffold_core.distributed import init_process_group``.
"""

from ..errors import DistributedError
from .env import TORCHRUN_VARS, DistEnv
from .groups import (
    DEFAULT_TIMEOUT_S,
    ProcessGroups,
    all_gather_objects,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    broadcast_object,
    current,
    destroy_process_group,
    init_process_group,
    normalize_init_method,
    resolve_cpu_group,
)

__all__ = [
    "DEFAULT_TIMEOUT_S", "TORCHRUN_VARS", "DistEnv", "DistributedError", "ProcessGroups", "all_gather_objects",
    "all_reduce_max", "all_reduce_sum", "barrier", "broadcast_object", "current", "destroy_process_group",
    "init_process_group", "normalize_init_method", "resolve_cpu_group",
]
