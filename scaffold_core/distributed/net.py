"""Network address helpers: IPv6-aware formatting, parsing and host IP discovery.

Addresses are stored raw (``::1``, never ``[::1]``). Brackets are added only
when building ``host:port`` strings or URLs (RFC 2732), idempotently: a host
that is already bracketed is never bracketed twice.

IPv6 zone ids (a link-local address's interface, ``fe80::1%eth0``) stay raw
in stored addresses and socket calls, which need the ``%``. Inside URL
brackets the ``%`` is written ``%25`` (RFC 6874): ``[fe80::1%25eth0]``.
Bracketed text is URL form, so :func:`strip_brackets` and
:func:`split_hostport` decode ``%25`` back (a bare ``%`` inside brackets is
accepted too); :func:`format_host` encodes it, and applying it twice changes
nothing. torch's ``tcp://`` rendezvous parser does not decode zone ids: hand
it :func:`torch_tcp_url`.

Host IP discovery (:func:`host_ip`) never needs to reach the internet. It asks,
in order: ``$SCAFFOLD_HOST_IP``; which source address the kernel would use for
the default route (a UDP ``connect`` sends no packet); what the host name
resolves to; and, for IPv6-only hosts, the global addresses in
``/proc/net/if_inet6``. It prefers a routable IPv4 address, falls back to a
routable IPv6 address on IPv6-only hosts, and to loopback when nothing else
exists.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import quote, unquote

HOST_IP_ENV = "SCAFFOLD_HOST_IP"

#: Route probes: addresses from the documentation ranges (RFC 5737 / RFC 3849). A UDP
#: ``connect`` to them only asks the kernel for a route; nothing is sent anywhere.
_ROUTE_PROBES: tuple[tuple[int, str], ...] = ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1"))


def strip_brackets(host: str) -> str:
    """The raw address: ``[::1]`` -> ``::1``, ``[fe80::1%25eth0]`` -> ``fe80::1%eth0``; unbracketed text unchanged.

    Surrounding spaces are removed. A zone id inside brackets is URL form and
    is decoded (RFC 6874); outside brackets the text is already raw.
    """
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        return _decode_zone(host[1:-1])
    return host


def _decode_zone(text: str) -> str:
    """``fe80::1%25eth0`` (URL form) -> ``fe80::1%eth0``; a bare ``%`` (``fe80::1%eth0``) is accepted as is."""
    address, sep, zone = text.partition("%")
    if not sep:
        return text
    if zone.startswith("25") and len(zone) > 2:
        zone = zone[2:]
    return f"{address}%{unquote(zone)}"


def _encode_zone(raw: str) -> str:
    """``fe80::1%eth0`` -> ``fe80::1%25eth0`` (RFC 6874: ``%`` and any unsafe zone character percent-encoded)."""
    address, sep, zone = raw.partition("%")
    if not sep:
        return raw
    return f"{address}%25{quote(zone, safe='-._~')}"


def is_ipv6(host: str) -> bool:
    """True for an IPv6 literal, bracketed or not (zone ids such as ``fe80::1%eth0`` included)."""
    raw = strip_brackets(host).split("%", 1)[0]
    try:
        return isinstance(ipaddress.ip_address(raw), ipaddress.IPv6Address)
    except ValueError:
        return False


def format_host(host: str) -> str:
    """The host as it must appear in a URL or ``host:port``: IPv6 bracketed exactly once, a zone id as ``%25``.

    ``format_host("fe80::1%eth0") == "[fe80::1%25eth0]"`` (RFC 6874); already
    formatted text comes back unchanged.
    """
    raw = strip_brackets(host)
    return f"[{_encode_zone(raw)}]" if is_ipv6(raw) else raw


def torch_tcp_url(host: str, port: int) -> str:
    """``tcp://host:port`` for torch's ``init_method``: IPv6 bracketed, a zone id left raw.

    torch hands the bracketed text to its store's socket code without
    decoding ``%25``, so a link-local address must reach it as
    ``tcp://[fe80::1%eth0]:port``. Every other URL uses :func:`format_url`.
    """
    raw = strip_brackets(host)
    shown = f"[{raw}]" if is_ipv6(raw) else raw
    return f"tcp://{shown}:{_check_port(port, repr(port))}"


def format_hostport(host: str, port: int) -> str:
    """``host:port`` with IPv6 bracketed: ``format_hostport("::1", 80) == "[::1]:80"``."""
    return f"{format_host(host)}:{_check_port(port, repr(port))}"


def format_url(scheme: str, host: str, port: int, path: str = "") -> str:
    """``scheme://host:port/path`` with IPv6 bracketed, e.g. ``tcp://[::1]:29500``."""
    if path and not path.startswith("/"):
        path = "/" + path
    return f"{scheme}://{format_hostport(host, port)}{path}"


def split_hostport(text: str) -> tuple[str, int]:
    """Parse ``host:port`` or ``[v6]:port`` into a raw host and an int port.

    A bare IPv6 address with a port (``::1:80``) is refused as ambiguous: write
    it ``[::1]:80``. A ``scheme://`` prefix and a trailing path are accepted
    (``tcp://[::1]:29500`` -> ``("::1", 29500)``). A zone id comes back raw:
    ``http://[fe80::1%25eth0]:80`` -> ``("fe80::1%eth0", 80)``.
    """
    original = text
    text = text.strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.split("/", 1)[0]
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not text[end + 1:].startswith(":"):
            raise ValueError(f"{original!r}: expected [ipv6]:port")
        host, port = _decode_zone(text[1:end]), text[end + 2:]
        if not is_ipv6(host):
            raise ValueError(f"{original!r}: {host!r} inside brackets is not an IPv6 address")
    else:
        if text.count(":") != 1:
            raise ValueError(f"{original!r}: expected host:port (write IPv6 as [addr]:port)")
        host, port = text.split(":")
    if not host:
        raise ValueError(f"{original!r}: the host is empty")
    return host, _check_port(port, original)


def _check_port(port: object, where: str) -> int:
    text = str(port).strip()
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{where}: port must be an integer in 1..65535, got {port!r}")
    return int(text)


def can_create(family: int) -> bool:
    """True when this host can create (and bind) a socket of ``family``.

    An IPv6 socket that can be created but not bound to ``::1`` (IPv6 disabled
    by sysctl) counts as unavailable.
    """
    if family == socket.AF_INET6 and not socket.has_ipv6:
        return False
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return False
    try:
        s.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        return True
    except OSError:
        return False
    finally:
        s.close()


def has_ipv6() -> bool:
    """True when this host can create and bind IPv6 sockets."""
    return can_create(socket.AF_INET6)


def has_ipv4() -> bool:
    """True when this host can create and bind IPv4 sockets."""
    return can_create(socket.AF_INET)


def loopback_host() -> str:
    """``127.0.0.1``, or ``::1`` on a host without IPv4."""
    return "127.0.0.1" if has_ipv4() or not has_ipv6() else "::1"


# ---------------------------------------------------------------------------
# Host IP discovery
# ---------------------------------------------------------------------------


def usable(address: str) -> bool:
    """True for an address other machines may reach: not loopback, link-local, unspecified or multicast."""
    try:
        ip = ipaddress.ip_address(strip_brackets(address).split("%", 1)[0])
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def route_source(family: int) -> str | None:
    """The source address the kernel would use for the default route of ``family`` (no packet is sent)."""
    target = dict(_ROUTE_PROBES)[family]
    try:
        s = socket.socket(family, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        s.connect((target, 9))
        return str(s.getsockname()[0])
    except OSError:
        return None
    finally:
        s.close()


def hostname_addresses() -> list[str]:
    """What this machine's host name resolves to (both families, in resolver order)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except OSError:
        return []
    return [str(info[4][0]) for info in infos]


def interface_ipv6_addresses(path: str = "/proc/net/if_inet6") -> list[str]:
    """IPv6 addresses configured on this host's interfaces (Linux ``/proc/net/if_inet6``)."""
    out: list[str] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if not fields or len(fields[0]) != 32:
            continue
        hexaddr = fields[0]
        try:
            out.append(str(ipaddress.IPv6Address(bytes.fromhex(hexaddr))))
        except ValueError:
            continue
    return out


def candidate_addresses(
    sources: Iterable[Callable[[], Iterable[str | None]]] | None = None,
) -> list[str]:
    """Every address the discovery sources report, in source order, without duplicates."""
    if sources is None:
        sources = (
            lambda: [route_source(socket.AF_INET)],
            hostname_addresses,
            lambda: [route_source(socket.AF_INET6)],
            interface_ipv6_addresses,
        )
    seen: list[str] = []
    for source in sources:
        try:
            found = list(source())
        except OSError:
            continue
        for address in found:
            if address and address not in seen:
                seen.append(address)
    return seen


def choose_address(candidates: Iterable[str], prefer: str = "auto") -> str | None:
    """The first usable address of the preferred family (IPv4 unless ``prefer="ipv6"``), else of the other.

    Candidates come in source order (the default route's address first), so
    a private address on the default route beats a public one on a side
    interface. Returns None when no candidate is usable.
    """
    if prefer not in ("auto", "ipv4", "ipv6"):
        raise ValueError(f"prefer must be 'auto', 'ipv4' or 'ipv6', got {prefer!r}")
    ranked: list[tuple[int, int, str]] = []
    for order, address in enumerate(candidates):
        if not usable(address):
            continue
        v6 = is_ipv6(address)
        ranked.append((int(v6) if prefer != "ipv6" else int(not v6), order, strip_brackets(address)))
    return min(ranked)[2] if ranked else None


def host_ip(prefer: str = "auto") -> str:
    """This machine's address for other machines to reach it (workers register it, servers advertise it).

    ``$SCAFFOLD_HOST_IP`` wins when set. Otherwise a routable IPv4 address,
    else a routable IPv6 address (IPv6-only hosts), else loopback. Needs no
    internet access.
    """
    override = os.environ.get(HOST_IP_ENV, "").strip()
    if override:
        return strip_brackets(override)
    chosen = choose_address(candidate_addresses(), prefer)
    return chosen if chosen is not None else loopback_host()
