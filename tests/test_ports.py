"""Port slices and reservations (scaffold_core.distributed.ports), including hosts without IPv6."""

from __future__ import annotations

import errno
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scaffold_testkit import port_stress

from scaffold_core.distributed import ports


@pytest.fixture
def free_range():
    """A 64-port range in the middle of this test's job range (away from other suites' rank-0 slices)."""
    lo, hi = ports.worker_port_range()
    mid = lo + (hi - lo) // 2 - 300
    return mid, mid + 63


def _bind_plain(port: int, host: str = "0.0.0.0") -> socket.socket:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, port))
    return s


def test_job_range_lies_below_the_kernel_ephemeral_range():
    eph_lo, _ = ports.ephemeral_range()
    lo, hi = ports.job_port_range()
    assert 1024 <= lo < hi < eph_lo
    c_lo, c_hi = ports.control_port_range()
    w_lo, w_hi = ports.worker_port_range()
    assert (c_lo, c_hi, w_hi) == (lo, lo + ports.CONTROL_PORTS - 1, hi) and w_lo == c_hi + 1


def test_job_range_moves_above_an_ephemeral_range_that_starts_low(monkeypatch):
    monkeypatch.delenv(ports.PORT_RANGE_ENV, raising=False)
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 60999))
    assert ports.job_port_range() == (61000, 65535)
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    with pytest.raises(OSError, match=ports.PORT_RANGE_ENV):
        ports.job_port_range()


def test_port_range_env_override_is_validated(monkeypatch):
    monkeypatch.setenv(ports.PORT_RANGE_ENV, "40000-40999")
    assert ports.job_port_range() == (40000, 40999)
    monkeypatch.setenv(ports.PORT_RANGE_ENV, "40000-39000")
    with pytest.raises(ValueError, match="low <= high"):
        ports.job_port_range()
    monkeypatch.setenv(ports.PORT_RANGE_ENV, "40000")
    with pytest.raises(ValueError, match="LOW-HIGH"):
        ports.job_port_range()


@given(st.integers(1, 512), st.integers(1024, 30000), st.integers(0, 30000))
def test_rank_slices_are_disjoint_and_inside_the_range(world, lo, extra):
    hi = min(65535, lo + world - 1 + extra)
    slices = [ports.rank_slice(r, world, (lo, hi)) for r in range(world)]
    for (a_lo, a_hi), (b_lo, _) in zip(slices, slices[1:]):
        assert a_lo <= a_hi < b_lo
    assert slices[0][0] >= lo and slices[-1][1] <= hi


def test_rank_slices_never_overlap_the_control_ports():
    c_lo, c_hi = ports.control_port_range()
    for world in (1, 2, 16):
        for rank in range(world):
            s_lo, _ = ports.rank_slice(rank, world)
            assert s_lo > c_hi


def test_rank_slice_errors():
    with pytest.raises(ValueError, match="not in"):
        ports.rank_slice(2, 2)
    with pytest.raises(ValueError, match="too small"):
        ports.rank_slice(0, 100, (30000, 30010))
    with pytest.raises(ValueError, match="1..65535"):
        ports.rank_slice(0, 1, (60000, 70000))


def test_a_reserved_port_cannot_be_bound_until_released(free_range):
    reservation = ports.reserve_port(port_range=free_range)
    port = reservation.port
    assert free_range[0] <= port <= free_range[1] and reservation.held
    with pytest.raises(OSError) as info:
        _bind_plain(port)
    assert info.value.errno == errno.EADDRINUSE
    assert reservation.release() == port and not reservation.held
    _bind_plain(port).close()


def test_busy_ports_are_skipped(free_range):
    lo, _ = free_range
    blocker = _bind_plain(lo)
    try:
        assert ports.try_reserve(lo) is None
        got = ports.reserve_ports(3, port_range=(lo, lo + 9), exclude={lo + 1})
        assert lo not in [r.port for r in got] and lo + 1 not in [r.port for r in got]
        for r in got:
            r.release()
    finally:
        blocker.close()


def test_reserve_ports_walks_the_slice_so_a_released_port_is_not_offered_again_at_once(free_range):
    first = ports.reserve_port(port_range=free_range).release()
    second = ports.reserve_port(port_range=free_range).release()
    assert first != second


def test_exhausted_slice_error_names_the_slice_and_the_fix(free_range):
    lo = free_range[0]
    with ports.reserve_port(port_range=(lo, lo)):
        with pytest.raises(OSError, match=rf"0 of 1 free ports in slice {lo}-{lo}.*{ports.PORT_RANGE_ENV}"):
            ports.reserve_ports(1, port_range=(lo, lo))


def test_take_socket_hands_over_a_bound_socket_with_no_window(free_range):
    reservation = ports.reserve_port(host="127.0.0.1", port_range=free_range)
    server = reservation.take_socket()
    try:
        server.listen(1)
        with socket.create_connection(("127.0.0.1", reservation.port), timeout=5):
            pass
        assert not reservation.held
    finally:
        server.close()


def test_a_host_without_ipv6_sockets_still_gets_ports(no_ipv6_sockets, free_range):
    """The anchor system reported every port busy here (the AF_INET6 socket failed)."""
    got = ports.reserve_ports(4, port_range=free_range)
    assert len({r.port for r in got}) == 4
    assert all(len(r.sockets) == 1 and r.sockets[0].family == socket.AF_INET for r in got)
    for r in got:
        r.release()


def test_a_host_with_ipv6_disabled_by_sysctl_still_gets_ports(monkeypatch, free_range):
    """IPv6 sockets can be created but '::' cannot be bound (EADDRNOTAVAIL)."""
    real_bind = socket.socket.bind

    class Sock(socket.socket):
        def bind(self, address):
            if self.family == socket.AF_INET6:
                raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
            return real_bind(self, address)

    monkeypatch.setattr(socket, "socket", Sock)
    got = ports.reserve_ports(2, port_range=free_range)
    assert len(got) == 2
    for r in got:
        r.release()


def test_an_address_that_is_not_on_this_machine_is_an_error_not_a_busy_port(free_range):
    with pytest.raises(OSError, match="address of this machine"):
        ports.reserve_ports(1, host="192.0.2.1", port_range=free_range)


def test_is_addr_in_use_understands_errno_messages_and_chains():
    assert ports.is_addr_in_use(OSError(errno.EADDRINUSE, "x"))
    assert ports.is_addr_in_use(RuntimeError("The server socket has failed to listen: Address already in use"))
    try:
        try:
            raise OSError(errno.EADDRINUSE, "bind")
        except OSError as inner:
            raise RuntimeError("server failed to start") from inner
    except RuntimeError as outer:
        assert ports.is_addr_in_use(outer)
    assert not ports.is_addr_in_use(OSError(errno.ECONNREFUSED, "refused"))


def test_bind_with_retry_moves_on_inside_the_slice_after_eaddrinuse(free_range):
    calls = []

    def start(port):
        calls.append(port)
        if len(calls) < 3:
            raise OSError(errno.EADDRINUSE, "Address already in use")
        return f"server on {port}"

    result = ports.bind_with_retry(start, port_range=free_range)
    assert len(set(calls)) == 3 and result == f"server on {calls[-1]}"
    assert all(free_range[0] <= p <= free_range[1] for p in calls)


def test_bind_with_retry_passes_other_errors_and_gives_up_after_attempts(free_range):
    def broken(port):
        raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        ports.bind_with_retry(broken, port_range=free_range)

    def always_busy(port):
        raise OSError(errno.EADDRINUSE, "Address already in use")

    with pytest.raises(OSError, match="address in use on 3 ports") as info:
        ports.bind_with_retry(always_busy, port_range=free_range, attempts=3)
    assert info.value.errno == errno.EADDRINUSE


@pytest.mark.slow
@pytest.mark.parametrize("no_ipv6", [False, True], ids=["ipv4+ipv6", "ipv6-disabled"])
def test_16_workers_reserving_8_ports_at_once_for_50_rounds_never_collide(no_ipv6):
    figures = port_stress.run(16, 8, 50, no_ipv6=no_ipv6, timeout_s=240)
    assert figures["rounds"] == 50
    assert figures["collisions"] == figures["eaddrinuse"] == figures["reserve_errors"] == 0, figures
    assert figures["out_of_slice"] == 0
    if no_ipv6:
        assert figures["children_saw_ipv6"] is False


@pytest.mark.slow
def test_the_stress_check_catches_probe_then_hope_allocation():
    """Workers sharing a slice: holding the bind keeps them apart; releasing right after probing does not."""
    held = port_stress.run(8, 8, 5, same_slice=True, timeout_s=120)
    assert held["collisions"] == held["eaddrinuse"] == 0, held
    naive = port_stress.run(8, 8, 5, same_slice=True, probe_only=True, timeout_s=120)
    assert naive["collisions"] > 0
