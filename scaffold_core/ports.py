"""Per-worker port allocation: disjoint slices of a job-wide range, reserved by binding.

The job-wide range lies below the OS ephemeral range (read from the kernel
where available), so ports the OS hands out to clients never collide with
ours. Rank ``r`` of ``n`` owns the ``r``-th of ``n`` equal slices. A port is
reserved by binding it (IPv4, and IPv6 where the host has it) and holding the
sockets until the owner is ready to bind for real; there is no
probe-then-hope window between workers, because no two workers share a slice.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_LOW = 20000
EPHEMERAL_FALLBACK = (32768, 60999)


def ephemeral_range() -> tuple[int, int]:
    """The OS ephemeral port range (Linux: /proc/sys/net/ipv4/ip_local_port_range)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return EPHEMERAL_FALLBACK


def job_port_range(low: int = DEFAULT_LOW) -> tuple[int, int]:
    """Inclusive job-wide range: from ``low`` up to just below the ephemeral range."""
    eph_lo, _ = ephemeral_range()
    high = eph_lo - 1
    if high - low < 64:
        low = max(1024, high - 8192)
    return low, high


def rank_slice(rank: int, world_size: int, port_range: tuple[int, int] | None = None) -> tuple[int, int]:
    """Inclusive port slice owned by ``rank`` (disjoint across ranks)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    lo, hi = port_range or job_port_range()
    size = (hi - lo + 1) // world_size
    if size < 1:
        raise ValueError(f"port range {lo}-{hi} is too small for {world_size} workers")
    start = lo + rank * size
    return start, start + size - 1


@dataclass
class PortReservation:
    """A port held by bound sockets; ``release()`` right before the real bind."""

    port: int
    host: str
    sockets: list[socket.socket] = field(default_factory=list)

    def release(self) -> int:
        for s in self.sockets:
            s.close()
        self.sockets.clear()
        return self.port

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _bind(family: int, host: str, port: int) -> socket.socket | None:
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None  # this address family is not available on this host
    try:
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((host, port))
        return s
    except OSError:
        s.close()
        raise


def try_reserve(port: int, host: str = "") -> PortReservation | None:
    """Bind ``port`` on IPv4 and (if available) IPv6; None if it is taken on either."""
    held: list[socket.socket] = []
    targets = [(socket.AF_INET, "0.0.0.0" if host in ("", "0.0.0.0") else host)]
    if host in ("", "0.0.0.0", "::"):
        targets.append((socket.AF_INET6, "::"))
    elif ":" in host:
        targets = [(socket.AF_INET6, host.strip("[]"))]
    try:
        for family, addr in targets:
            s = _bind(family, addr, port)
            if s is not None:
                held.append(s)
    except OSError:
        for s in held:
            s.close()
        return None
    if not held:
        return None
    return PortReservation(port, host, held)


def reserve_ports(count: int, *, rank: int = 0, world_size: int = 1, host: str = "",
                  port_range: tuple[int, int] | None = None,
                  exclude: set[int] | None = None) -> list[PortReservation]:
    """Reserve ``count`` ports from this rank's slice; raises OSError if the slice is exhausted."""
    lo, hi = rank_slice(rank, world_size, port_range)
    out: list[PortReservation] = []
    skip = exclude or set()
    for port in range(lo, hi + 1):
        if len(out) == count:
            break
        if port in skip:
            continue
        reservation = try_reserve(port, host)
        if reservation is not None:
            out.append(reservation)
    if len(out) < count:
        for r in out:
            r.release()
        raise OSError(f"only {len(out)} of {count} free ports in slice {lo}-{hi} (rank {rank} of {world_size})")
    return out
