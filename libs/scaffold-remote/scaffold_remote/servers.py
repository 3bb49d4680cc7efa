"""Server URLs and load balancing: least in-flight requests, one episode sticks to one server.

Keeping an episode on one server lets the server's prefix cache (SGLang's
radix cache, vLLM's automatic prefix caching) reuse the prompt across the
episode's samples and turns. A server that refuses connections is skipped for
a short cool-down; its episodes move to the least loaded healthy server.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from scaffold_core.distributed.net import format_url, is_ipv6, strip_brackets

STICKY_LIMIT = 200_000  # episodes remembered; the oldest are forgotten first
COOL_DOWN_S = (1.0, 30.0)  # a failing server is skipped 1 s, doubling per consecutive failure, at most 30 s


def normalize_url(text: str) -> str:
    """``http://host:port`` with IPv6 bracketed once and no trailing slash; raises ValueError naming the fix.

    Accepts ``http(s)://host:port[/]``, ``host:port`` and ``[v6]:port``; a bare
    IPv6 address with a port (``::1:30000``) is ambiguous and refused. A zone
    id may be written ``[fe80::1%25eth0]`` (RFC 6874) or ``[fe80::1%eth0]``;
    it comes back as ``%25``, its case kept.
    """
    raw = str(text).strip()
    if not raw:
        raise ValueError("empty server URL")
    if "://" not in raw:
        if raw.count(":") > 1 and not raw.startswith("["):
            raise ValueError(f"{text!r}: write an IPv6 server as http://[addr]:port, e.g. http://[::1]:30000")
        raw = "http://" + raw
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{text!r}: the scheme must be http or https")
    netloc = parts.netloc.rsplit("@", 1)[-1]
    if netloc.count(":") > 1 and not netloc.startswith("["):
        raise ValueError(f"{text!r}: write an IPv6 server as http://[addr]:port, e.g. http://[::1]:30000")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r}: the port must be an integer in 1..65535") from None
    host = strip_brackets(netloc.rsplit(":", 1)[0]) if netloc.startswith("[") else parts.hostname  # zone case kept
    if not host:
        raise ValueError(f"{text!r}: no host in the URL")
    if port is None:
        raise ValueError(f"{text!r}: no port in the URL, e.g. http://127.0.0.1:8000")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{text!r}: give the server's base URL (no path such as /generate)")
    if ":" in host and not is_ipv6(host):
        raise ValueError(f"{text!r}: {host!r} is not a valid IPv6 address")
    return format_url(parts.scheme, host, port)


def parse_urls(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """One URL, a comma-separated string of URLs, or a list; normalized, duplicates refused."""
    items = value.split(",") if isinstance(value, str) else list(value)
    urls = [normalize_url(u) for u in items if str(u).strip()]
    if not urls:
        raise ValueError("no server URL given")
    seen = set()
    for u in urls:
        if u in seen:
            raise ValueError(f"server {u} is listed twice")
        seen.add(u)
    return urls


@dataclass(eq=False)
class Server:
    """One inference server and what the client knows about it."""

    url: str
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    down_until: float = 0.0
    endpoint: Any = field(default=None, repr=False)  # its generation Endpoint in the client's connection pool

    def up(self, now: float) -> bool:
        return self.down_until <= now


class ServerPool:
    """Picks a server per request: the episode's own server, else the least loaded healthy one."""

    def __init__(self, urls: list[str], *, sticky: bool = True, sticky_limit: int = STICKY_LIMIT):
        self.servers = [Server(u) for u in urls]
        self.sticky = sticky
        self.sticky_limit = sticky_limit
        self._episodes: OrderedDict[str, Server] = OrderedDict()

    def pick(self, episode_id: str | None) -> Server:
        servers = self.servers
        if len(servers) == 1:
            return servers[0]
        now = time.monotonic()
        key = episode_id if self.sticky else None
        if key is not None:
            server = self._episodes.get(key)
            if server is not None and server.up(now):
                self._episodes.move_to_end(key)
                return server
        healthy = [s for s in servers if s.up(now)] or servers
        best = min(healthy, key=lambda s: (s.in_flight, s.requests))
        if key is not None:
            self._episodes[key] = best
            self._episodes.move_to_end(key)
            if len(self._episodes) > self.sticky_limit:
                self._episodes.popitem(last=False)
        return best

    def mark_down(self, server: Server) -> float:
        """Skip ``server`` for a while (it refused or dropped a connection); returns the cool-down in seconds."""
        base, most = COOL_DOWN_S
        server.failures += 1
        seconds = min(most, base * 2 ** server.consecutive_failures)
        server.consecutive_failures += 1
        server.down_until = max(server.down_until, time.monotonic() + seconds)
        return seconds

    def mark_up(self, server: Server) -> None:
        """``server`` answered: use it again."""
        server.down_until = 0.0
        server.consecutive_failures = 0

    def episode_server(self, episode_id: str) -> Server | None:
        return self._episodes.get(episode_id)
