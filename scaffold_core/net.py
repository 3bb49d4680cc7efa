"""Network address helpers: IPv6-aware formatting and parsing.

Addresses are stored raw (``::1``, never ``[::1]``). Brackets are added only
when building ``host:port`` strings or URLs (RFC 2732), idempotently.
"""

from __future__ import annotations

import ipaddress
import socket


def strip_brackets(host: str) -> str:
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


def is_ipv6(host: str) -> bool:
    """True for an IPv6 literal, bracketed or not (zone ids such as ``fe80::1%eth0`` included)."""
    raw = strip_brackets(host).split("%", 1)[0]
    try:
        return isinstance(ipaddress.ip_address(raw), ipaddress.IPv6Address)
    except ValueError:
        return False


def format_host(host: str) -> str:
    """The host as it must appear in a URL or ``host:port``: IPv6 bracketed exactly once."""
    raw = strip_brackets(host)
    return f"[{raw}]" if is_ipv6(raw) else raw


def format_hostport(host: str, port: int) -> str:
    return f"{format_host(host)}:{int(port)}"


def format_url(scheme: str, host: str, port: int, path: str = "") -> str:
    if path and not path.startswith("/"):
        path = "/" + path
    return f"{scheme}://{format_hostport(host, port)}{path}"


def split_hostport(text: str) -> tuple[str, int]:
    """Parse ``host:port``, ``[v6]:port`` (and a bare ``v6`` is refused as ambiguous)."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not text[end + 1:].startswith(":"):
            raise ValueError(f"{text!r}: expected [ipv6]:port")
        host, port = text[1:end], text[end + 2:]
    else:
        if text.count(":") != 1:
            raise ValueError(f"{text!r}: expected host:port (write IPv6 as [addr]:port)")
        host, port = text.split(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: port must be an integer in 1..65535")
    return host, int(port)


def has_ipv6() -> bool:
    """True when this host can create IPv6 sockets."""
    if not socket.has_ipv6:
        return False
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
        return True
    except OSError:
        return False
