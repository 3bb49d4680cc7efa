"""IPv6-aware address formatting, parsing and host IP discovery (scaffold_core.distributed.net)."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaffold_core.distributed import net

ipv6_addresses = st.ip_addresses(v=6).map(str)
ipv4_addresses = st.ip_addresses(v=4).map(str)
ports = st.integers(min_value=1, max_value=65535)


@given(ipv6_addresses, ports)
def test_ipv6_is_bracketed_exactly_once_however_often_formatted(host, port):
    once = net.format_host(host)
    assert once == f"[{host}]"
    assert net.format_host(once) == once  # idempotent: never [[::1]]
    assert net.format_hostport(once, port) == net.format_hostport(host, port) == f"[{host}]:{port}"
    assert net.split_hostport(net.format_hostport(host, port)) == (host, port)


@given(ipv4_addresses, ports)
def test_ipv4_is_never_bracketed_and_round_trips(host, port):
    assert net.format_hostport(host, port) == f"{host}:{port}"
    assert net.split_hostport(f"{host}:{port}") == (host, port)


def test_urls_bracket_ipv6_for_tcp_rendezvous():
    assert net.format_url("tcp", "::1", 29500) == "tcp://[::1]:29500"
    assert net.format_url("tcp", "[::1]", 29500) == "tcp://[::1]:29500"
    assert net.format_url("http", "fe80::1%eth0", 80, "generate") == "http://[fe80::1%25eth0]:80/generate"
    assert net.format_url("http", "node-3.cluster", 8000, "/health") == "http://node-3.cluster:8000/health"


def test_split_hostport_accepts_urls_and_host_names():
    assert net.split_hostport("tcp://[::1]:29500") == ("::1", 29500)
    assert net.split_hostport("http://10.0.0.2:8000/generate") == ("10.0.0.2", 8000)
    assert net.split_hostport(" localhost:80 ") == ("localhost", 80)


@pytest.mark.parametrize("text, problem", [
    ("::1:8000", "write IPv6 as [addr]:port"),
    ("[::1]8000", "expected [ipv6]:port"),
    ("[not-v6]:80", "not an IPv6 address"),
    ("host:0", "1..65535"),
    ("host:99999", "1..65535"),
    ("host:http", "1..65535"),
    (":80", "host is empty"),
    ("host", "expected host:port"),
])
def test_split_hostport_errors_name_the_problem(text, problem):
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        net.split_hostport(text)


def test_format_hostport_refuses_bad_ports():
    with pytest.raises(ValueError, match="1..65535"):
        net.format_hostport("::1", 70000)


def test_is_ipv6():
    assert net.is_ipv6("::1") and net.is_ipv6("[::1]") and net.is_ipv6("fe80::1%eth0")
    assert not net.is_ipv6("127.0.0.1") and not net.is_ipv6("localhost") and not net.is_ipv6("[localhost]")


def test_choose_address_prefers_routable_ipv4_then_ipv6():
    assert net.choose_address(["127.0.0.1", "::1", "2001:db8::7", "10.1.2.3"]) == "10.1.2.3"
    assert net.choose_address(["10.1.2.3", "2001:db8::7"], prefer="ipv6") == "2001:db8::7"
    # The default route's address (listed first) beats a later one of the same family.
    assert net.choose_address(["192.168.1.5", "8.8.4.4"]) == "192.168.1.5"
    # IPv6-only host: loopback, link-local and unspecified addresses are skipped.
    assert net.choose_address(["127.0.1.1", "::1", "fe80::1", "::", "2001:db8::7"]) == "2001:db8::7"
    assert net.choose_address(["127.0.0.1", "::1", "fe80::2"]) is None
    with pytest.raises(ValueError, match="prefer"):
        net.choose_address([], prefer="v4")


def test_host_ip_on_an_ipv6_only_host(monkeypatch):
    """No IPv4 route, the host name resolves to loopback and a global IPv6 address."""
    monkeypatch.delenv(net.HOST_IP_ENV, raising=False)
    monkeypatch.setattr(net, "route_source", lambda family: None if family == socket.AF_INET else "2001:db8::42")
    monkeypatch.setattr(net, "hostname_addresses", lambda: ["127.0.1.1", "::1"])
    monkeypatch.setattr(net, "interface_ipv6_addresses", lambda: ["fe80::1", "2001:db8::43"])
    assert net.host_ip() == "2001:db8::42"


def test_host_ip_falls_back_to_loopback_and_honours_the_override(monkeypatch):
    monkeypatch.delenv(net.HOST_IP_ENV, raising=False)
    monkeypatch.setattr(net, "candidate_addresses", lambda: ["127.0.0.1", "::1"])
    monkeypatch.setattr(net, "has_ipv4", lambda: False)
    monkeypatch.setattr(net, "has_ipv6", lambda: True)
    assert net.host_ip() == "::1"
    monkeypatch.setenv(net.HOST_IP_ENV, "[2001:db8::9]")
    assert net.host_ip() == "2001:db8::9"


def test_host_ip_on_this_machine_is_an_address():
    ipaddress.ip_address(net.host_ip().split("%")[0])  # never raises, needs no internet


def test_interface_ipv6_addresses_reads_proc_format(tmp_path):
    table = tmp_path / "if_inet6"
    table.write_text("00000000000000000000000000000001 01 80 10 80       lo\n"
                     "20010db8000000000000000000000042 02 40 00 00     eth0\n"
                     "garbage\n")
    assert net.interface_ipv6_addresses(str(table)) == ["::1", "2001:db8::42"]
    assert net.interface_ipv6_addresses(str(tmp_path / "missing")) == []


def test_has_ipv6_is_false_when_ipv6_sockets_cannot_be_created(no_ipv6_sockets):
    assert net.has_ipv6() is False
    assert net.has_ipv4() is True
    assert net.loopback_host() == "127.0.0.1"
    assert net.route_source(socket.AF_INET6) is None


# -- IPv6 zone ids (RFC 6874) --------------------------------------------------------

zones = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-%~", min_size=1, max_size=12)


@given(ipv6_addresses, zones, ports)
def test_zone_ids_are_percent_encoded_in_urls_and_come_back_raw(address, zone, port):
    raw = f"{address}%{zone}"
    formatted = net.format_host(raw)
    assert formatted.startswith(f"[{address}%25") and formatted.endswith("]")
    assert formatted[len(address) + 4:-1].count("%") == zone.count("%")  # a % inside the zone is encoded too
    assert net.format_host(formatted) == formatted  # idempotent: never %2525
    assert net.strip_brackets(formatted) == raw
    url = net.format_url("http", raw, port, "/generate")
    assert url == f"http://{formatted}:{port}/generate"
    assert net.split_hostport(url) == (raw, port)
    assert net.split_hostport(net.format_hostport(formatted, port)) == (raw, port)


def test_zone_id_examples():
    assert net.format_host("fe80::1%eth0") == "[fe80::1%25eth0]"
    assert net.format_hostport("[fe80::1%25eth0]", 8000) == "[fe80::1%25eth0]:8000"
    assert net.format_url("tcp", "fe80::1%2", 29500) == "tcp://[fe80::1%252]:29500"  # numeric zone (if index)
    assert net.split_hostport("http://[fe80::1%25eth0]:80/health") == ("fe80::1%eth0", 80)
    assert net.split_hostport("[fe80::1%eth0]:80") == ("fe80::1%eth0", 80)  # a bare % in brackets is accepted
    assert net.strip_brackets("[fe80::1%25en0]") == "fe80::1%en0"
    assert net.strip_brackets("fe80::1%25") == "fe80::1%25"  # unbracketed text is raw: zone "25"
    assert net.format_host("fe80::1%25") == "[fe80::1%2525]"
    assert net.is_ipv6("[fe80::1%25eth0]") and net.usable("2001:db8::1%eth0") and not net.usable("fe80::1%eth0")


def test_the_url_form_parses_as_rfc_6874_and_the_raw_form_is_what_sockets_take():
    from urllib.parse import urlsplit

    url = net.format_url("http", "fe80::1%lo", 8000)
    assert urlsplit(url).hostname == "fe80::1%25lo" and urlsplit(url).port == 8000  # the URL keeps %25
    host, port = net.split_hostport(url)
    assert host == "fe80::1%lo"
    if not net.has_ipv6():
        pytest.skip("this host has no IPv6")
    info = socket.getaddrinfo(host, port, socket.AF_INET6, socket.SOCK_STREAM)
    assert info[0][4][3] == socket.if_nametoindex("lo")  # the zone became the scope id
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(urlsplit(url).hostname, port, socket.AF_INET6, socket.SOCK_STREAM)


def test_torch_rendezvous_urls_keep_the_zone_raw():
    from urllib.parse import urlparse

    from scaffold_core.distributed.env import DistEnv
    from scaffold_core.distributed.groups import normalize_init_method

    url = net.torch_tcp_url("fe80::1%eth0", 29500)
    assert url == "tcp://[fe80::1%eth0]:29500"
    assert urlparse(url).hostname == "fe80::1%eth0"  # what torch's tcp:// handler hands its store's sockets
    assert normalize_init_method("tcp://[fe80::1%25eth0]:29500") == url
    assert DistEnv(0, 1, 0, 1, "fe80::1%eth0", 29500).init_method == url
    assert normalize_init_method("tcp://[::1]:29500") == net.torch_tcp_url("::1", 29500) == "tcp://[::1]:29500"
    assert net.torch_tcp_url("10.0.0.1", 80) == "tcp://10.0.0.1:80"
