"""Per-worker port allocation: disjoint slices of a job-wide range, reserved by binding.

The job-wide range lies below the OS ephemeral range (read from the kernel
where available), so ports the OS hands out to clients never collide with
ours; ``$SCAFFOLD_PORT_RANGE=LOW-HIGH`` sets it explicitly. Its lowest
:data:`CONTROL_PORTS` ports are kept for rendezvous ports (``MASTER_PORT``);
the rest is split into equal slices and rank ``r`` of ``n`` owns the
``r``-th slice.

A port is reserved by binding it (IPv4, and IPv6 where the host has it) and
holding the sockets until the owner is ready to bind for real: there is no
probe-then-hope window between workers, because no two workers share a slice
and a held port cannot be bound by anyone. A host without IPv6 (no AF_INET6
sockets, or IPv6 disabled so ``::`` cannot be bound) still gets ports: the
missing family is skipped, not reported busy. Handing over:

* ``PortReservation.take_socket()`` gives the bound socket itself to an
  in-process server (``listen()`` on it): no window at all.
* ``PortReservation.release()`` right before a subprocess binds; if that
  bind still fails with EADDRINUSE (another job on the host), retry inside
  the slice with :func:`bind_with_retry`.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .net import is_ipv6, strip_brackets

DEFAULT_LOW = 20000
EPHEMERAL_FALLBACK = (32768, 60999)
#: The lowest ports of the job range, kept for rendezvous ports; never part of a rank slice.
CONTROL_PORTS = 64
#: Smallest job range worth using (below it we look above the ephemeral range instead).
MIN_RANGE = 256
PORT_RANGE_ENV = "SCAFFOLD_PORT_RANGE"

#: bind() errors meaning "someone holds this port".
BUSY_ERRNOS = frozenset({errno.EADDRINUSE, errno.EACCES})
#: bind()/socket() errors meaning "this address family or address is not available here".
UNAVAILABLE_ERRNOS = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT})

T = TypeVar("T")


def ephemeral_range() -> tuple[int, int]:
    """The OS ephemeral port range (Linux: /proc/sys/net/ipv4/ip_local_port_range)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return EPHEMERAL_FALLBACK


def parse_port_range(text: str, where: str = PORT_RANGE_ENV) -> tuple[int, int]:
    """``"20000-32767"`` -> ``(20000, 32767)``, validated."""
    parts = text.replace(" ", "").split("-")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{where}={text!r}: expected LOW-HIGH, e.g. 20000-32767")
    return check_port_range((int(parts[0]), int(parts[1])), where)


def check_port_range(port_range: tuple[int, int], where: str = "port_range") -> tuple[int, int]:
    lo, hi = (int(p) for p in port_range)
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"{where}: {lo}-{hi} is not a port range within 1..65535 (low <= high)")
    return lo, hi


def job_port_range(low: int = DEFAULT_LOW) -> tuple[int, int]:
    """Inclusive job-wide range: from ``low`` up to just below the ephemeral range.

    ``$SCAFFOLD_PORT_RANGE`` overrides it. When the kernel's ephemeral range
    starts too low to leave room below it, the range above it is used; when
    neither has room, the error says how to set one.
    """
    env = os.environ.get(PORT_RANGE_ENV, "").strip()
    if env:
        return parse_port_range(env)
    eph_lo, eph_hi = ephemeral_range()
    high = eph_lo - 1
    if high - low < 64:
        low = max(1024, high - 8192)
    if high - low + 1 >= MIN_RANGE:
        return low, high
    if 65535 - eph_hi >= MIN_RANGE:
        return eph_hi + 1, 65535
    raise OSError(f"the OS ephemeral port range {eph_lo}-{eph_hi} leaves no room for a job port range; "
                  f"set {PORT_RANGE_ENV}=LOW-HIGH (ports no other service uses)")


def control_port_range(port_range: tuple[int, int] | None = None) -> tuple[int, int]:
    """The rendezvous ports: the lowest :data:`CONTROL_PORTS` ports of the job range."""
    lo, hi = check_port_range(port_range) if port_range else job_port_range()
    return lo, min(hi, lo + CONTROL_PORTS - 1)


def worker_port_range(port_range: tuple[int, int] | None = None) -> tuple[int, int]:
    """The job range without its control ports: what rank slices divide."""
    lo, hi = check_port_range(port_range) if port_range else job_port_range()
    if hi - lo + 1 <= 2 * CONTROL_PORTS:
        return lo, hi  # too small to spare control ports
    return lo + CONTROL_PORTS, hi


def rank_slice(rank: int, world_size: int, port_range: tuple[int, int] | None = None) -> tuple[int, int]:
    """Inclusive port slice owned by ``rank`` (disjoint across ranks).

    Without ``port_range`` the slices divide :func:`worker_port_range`; an
    explicit ``port_range`` is divided whole.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    lo, hi = check_port_range(port_range) if port_range else worker_port_range()
    size = (hi - lo + 1) // world_size
    if size < 1:
        raise ValueError(f"port range {lo}-{hi} is too small for {world_size} workers; "
                         f"set a wider one with {PORT_RANGE_ENV}=LOW-HIGH")
    start = lo + rank * size
    return start, start + size - 1


@dataclass
class PortReservation:
    """A port held by bound sockets.

    ``release()`` right before the real bind (or ``take_socket()`` to hand the
    bound socket itself to an in-process server). Also a context manager.
    """

    port: int
    host: str
    sockets: list[socket.socket] = field(default_factory=list)

    def release(self) -> int:
        """Close the holding sockets; returns the port, free for the real bind."""
        for s in self.sockets:
            s.close()
        self.sockets.clear()
        return self.port

    def take_socket(self, family: int | None = None) -> socket.socket:
        """Hand over one bound socket (of ``family``, default the first held) and release the rest.

        The caller owns it: ``sock.listen()`` and serve on it, so no one can
        take the port between reservation and use.
        """
        chosen = next((s for s in self.sockets if family is None or s.family == family), None)
        if chosen is None:
            raise OSError(f"port {self.port}: no held socket of family {family!r} to hand over")
        self.sockets.remove(chosen)
        self.release()
        return chosen

    @property
    def held(self) -> bool:
        return bool(self.sockets)

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _targets(host: str) -> list[tuple[int, str, bool]]:
    """(family, address, optional) pairs to bind for ``host``; optional families may be missing here."""
    raw = strip_brackets(host)
    if raw in ("", "0.0.0.0", "::"):
        return [(socket.AF_INET, "0.0.0.0", True), (socket.AF_INET6, "::", True)]
    if is_ipv6(raw):
        return [(socket.AF_INET6, raw, False)]
    try:
        socket.inet_aton(raw)
        return [(socket.AF_INET, raw, False)]
    except OSError:
        pass
    try:  # a host name such as "localhost": every address it resolves to
        infos = socket.getaddrinfo(raw, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except OSError as exc:
        raise OSError(f"cannot reserve ports on {host!r}: the name does not resolve ({exc})") from None
    out: list[tuple[int, str, bool]] = []
    for family, *_rest, sockaddr in infos:
        target = (family, str(sockaddr[0]), True)
        if family in (socket.AF_INET, socket.AF_INET6) and target not in out:
            out.append(target)
    return out


class _Unavailable(Exception):
    """This address family / address cannot be bound on this host (not a busy port)."""


def _bind(family: int, host: str, port: int) -> socket.socket:
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise _Unavailable(str(exc)) from None  # e.g. a kernel without IPv6
    try:
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        # No SO_REUSEADDR: two bound (not listening) sockets that both set it may share a port.
        s.bind((host, port))
        return s
    except OSError as exc:
        s.close()
        if exc.errno in UNAVAILABLE_ERRNOS:
            raise _Unavailable(str(exc)) from None  # e.g. IPv6 disabled by sysctl: "::" cannot be bound
        raise


def try_reserve(port: int, host: str = "") -> PortReservation | None:
    """Bind ``port`` on IPv4 and (if available) IPv6; None if it is taken on either.

    ``host`` "" (the default), ``0.0.0.0`` or ``::`` reserves the port on every
    address of both families. An address family this host lacks is skipped,
    never reported busy. Raises OSError when nothing at all can be bound for
    ``host`` (for instance an address that is not on this machine).
    """
    held: list[socket.socket] = []
    unavailable: list[str] = []
    for family, addr, optional in _targets(host):
        try:
            held.append(_bind(family, addr, port))
        except _Unavailable as exc:
            if not optional:
                _close(held)
                raise OSError(f"cannot reserve ports on {host!r}: {exc} (is it an address of this machine?)") \
                    from None
            unavailable.append(f"{addr}: {exc}")
        except OSError as exc:
            _close(held)
            if exc.errno in BUSY_ERRNOS:
                return None
            raise
    if not held:
        raise OSError(f"cannot reserve ports on {host!r}: no address family can be bound here "
                      f"({'; '.join(unavailable)})")
    return PortReservation(port, host, held)


def _close(sockets: list[socket.socket]) -> None:
    for s in sockets:
        s.close()


_cursor_lock = threading.Lock()
_cursors: dict[tuple[int, int], int] = {}


def _scan_order(lo: int, hi: int) -> list[int]:
    """Ports of ``lo..hi`` starting after the last one this process handed out (round robin).

    A port just released for a server that has not bound it yet is thus the
    last one this process offers again.
    """
    with _cursor_lock:
        start = _cursors.get((lo, hi), lo)
    start = start if lo <= start <= hi else lo
    return list(range(start, hi + 1)) + list(range(lo, start))


def _advance(lo: int, hi: int, last: int) -> None:
    with _cursor_lock:
        _cursors[(lo, hi)] = last + 1 if last < hi else lo


def reserve_ports(count: int, *, rank: int = 0, world_size: int = 1, host: str = "",
                  port_range: tuple[int, int] | None = None,
                  exclude: set[int] | None = None) -> list[PortReservation]:
    """Reserve ``count`` ports from this rank's slice; raises OSError if the slice is exhausted.

    The ports stay bound (held) until each reservation is released or its
    socket taken. Successive calls in one process walk the slice round robin.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    lo, hi = rank_slice(rank, world_size, port_range)
    out: list[PortReservation] = []
    skip = exclude or set()
    try:
        for port in _scan_order(lo, hi):
            if len(out) == count:
                break
            if port in skip:
                continue
            reservation = try_reserve(port, host)
            if reservation is not None:
                out.append(reservation)
    except BaseException:
        for r in out:
            r.release()
        raise
    if len(out) < count:
        for r in out:
            r.release()
        raise OSError(f"only {len(out)} of {count} free ports in slice {lo}-{hi} (rank {rank} of {world_size}); "
                      f"free some, or give the job a wider range with {PORT_RANGE_ENV}=LOW-HIGH")
    if out:
        _advance(lo, hi, out[-1].port)
    return out


def reserve_port(*, rank: int = 0, world_size: int = 1, host: str = "",
                 port_range: tuple[int, int] | None = None, exclude: set[int] | None = None) -> PortReservation:
    """One reserved port from this rank's slice (see :func:`reserve_ports`)."""
    return reserve_ports(1, rank=rank, world_size=world_size, host=host, port_range=port_range, exclude=exclude)[0]


def is_addr_in_use(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause/context) says an address is already in use."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.EADDRINUSE:
            return True
        text = str(current).lower()
        if "address already in use" in text or "eaddrinuse" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


def bind_with_retry(start: Callable[[int], T], *, rank: int = 0, world_size: int = 1, host: str = "",
                    port_range: tuple[int, int] | None = None, attempts: int = 8,
                    exclude: set[int] | None = None,
                    in_use: Callable[[BaseException], bool] = is_addr_in_use) -> T:
    """Run ``start(port)`` on a port from this rank's slice, retrying on EADDRINUSE.

    Each attempt reserves a free port, releases it and calls ``start`` (which
    binds it for real: starts a server, a TCP store...). When ``start`` raises
    an address-in-use error (``in_use`` decides; the default understands
    OSError EADDRINUSE and "address already in use" messages), that port is
    excluded and the next one in the slice is tried, up to ``attempts``
    times. Any other error propagates at once.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    tried: set[int] = set(exclude or ())
    last: BaseException | None = None
    for _ in range(attempts):
        port = reserve_port(rank=rank, world_size=world_size, host=host, port_range=port_range,
                            exclude=tried).release()
        try:
            return start(port)
        except BaseException as exc:
            if not in_use(exc):
                raise
            tried.add(port)
            last = exc
    lo, hi = rank_slice(rank, world_size, port_range)
    raise OSError(errno.EADDRINUSE, f"address in use on {attempts} ports of slice {lo}-{hi} "
                  f"(tried {sorted(tried)}); last error: {last}") from last
