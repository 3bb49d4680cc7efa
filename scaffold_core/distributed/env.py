"""Where a process sits in a job: torchrun's variables (``RANK``, ``WORLD_SIZE``, ...), validated."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import DistributedError
from .net import strip_brackets, torch_tcp_url


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, where the OS tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _int_var(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(f"{name}={raw!r} is not an integer (torchrun sets it; so does "
                               f"`scaffold run --workers N`)") from None


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in a job: torchrun's variables, validated.

    ``master_addr`` is stored raw (``::1``, never ``[::1]``).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    launched: bool = False  # True when RANK/WORLD_SIZE came from a launcher

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise DistributedError(f"WORLD_SIZE must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise DistributedError(f"RANK {self.rank} is not in [0, WORLD_SIZE={self.world_size})")
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise DistributedError(f"LOCAL_RANK {self.local_rank} is not in "
                                   f"[0, LOCAL_WORLD_SIZE={self.local_world_size})")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise DistributedError(f"MASTER_PORT must be in 1..65535, got {self.master_port}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DistEnv:
        """Read torchrun's variables; without ``RANK``/``WORLD_SIZE`` this is a single process."""
        env = os.environ if environ is None else environ
        rank = _int_var(env, "RANK", None)
        world = _int_var(env, "WORLD_SIZE", None)
        if (rank is None) != (world is None):
            missing = "WORLD_SIZE" if world is None else "RANK"
            raise DistributedError(f"{missing} is not set but {'RANK' if world is None else 'WORLD_SIZE'} is: "
                                   "set both (torchrun does) or neither")
        local_rank = _int_var(env, "LOCAL_RANK", None)
        local_world = _int_var(env, "LOCAL_WORLD_SIZE", None)
        launched = rank is not None
        rank, world = rank or 0, world or 1
        if local_rank is None:
            local_rank = rank if local_world is None else rank % local_world
        if local_world is None:  # one machine, unless torchrun says otherwise
            local_world = max(world, local_rank + 1)
        addr = strip_brackets(env.get("MASTER_ADDR", "") or "127.0.0.1")
        return cls(rank, world, local_rank, local_world, addr, _int_var(env, "MASTER_PORT", None), launched)

    @property
    def init_method(self) -> str:
        """torch's ``tcp://host:port`` with IPv6 bracketed (a zone id left raw, as torch's parser needs)."""
        if self.master_port is None:
            raise DistributedError("MASTER_PORT is not set: torchrun sets it; pass master_port= or "
                                   "init_method='tcp://HOST:PORT' explicitly")
        return torch_tcp_url(self.master_addr, self.master_port)

    def to_env(self) -> dict[str, str]:
        """torchrun's variables for a worker process in this position."""
        env = {
            "RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size), "GROUP_RANK": str(self.rank // self.local_world_size),
            "MASTER_ADDR": self.master_addr,
        }
        if self.master_port is not None:
            env["MASTER_PORT"] = str(self.master_port)
        return env
