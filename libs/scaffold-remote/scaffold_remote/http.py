"""A lean HTTP/1.1 keep-alive connection pool: every request a remote engine sends goes through one.

A general client (aiohttp: redirects, cookies, tracing, header multidicts, a
writer task per request) spends about 100 us of CPU per request, most of the
client's time against a fast server. An inference server's endpoints need none
of that: one request of a JSON body to a fixed path and one answer. This pool
writes a prebuilt request head and the body in one write on a pooled asyncio
connection and frames the answer itself (``Content-Length``, chunked, or
ended by the server closing the connection). The remote client
(:mod:`scaffold_remote.client`) keeps two: one for generation, one for
the control endpoints, so a pause or a weight update never waits behind a
thousand generations for a connection.

What it guarantees:

* At most ``limit`` requests hold connections at once; the others wait in
  arrival order.
* Opening a connection is bounded by ``connect_timeout``
  (:class:`ConnectTimeout`); a whole request (waiting for a connection,
  connecting, sending, the full answer) by ``request_timeout`` or its own
  ``timeout`` (:class:`RequestTimeout`, checked every ``timeout / 20`` s, at
  most every second, so it fires up to 5% late).
* Idle connections are reused newest first and closed after ``keepalive_s``
  (4 s: before uvicorn (SGLang, vLLM) drops them at 5 s, so a request rarely meets a
  connection the server is closing); one the server closed is dropped.
* Failures are ``OSError`` subclasses: :class:`CannotConnect`,
  :class:`ServerDisconnected` (the connection closed or broke before the full
  answer), :class:`MalformedResponse`. A connection that failed, timed out or
  whose request was cancelled is closed, never reused.
* ``https`` URLs use the default verifying TLS context; no proxies (as
  aiohttp without ``trust_env``). Host names are resolved once per
  ``dns_ttl_s``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl as ssl_module
from collections import deque
from typing import Any
from urllib.parse import urlsplit

from scaffold_core.distributed.net import split_hostport

MAX_HEAD = 64 * 1024  # bytes of status line and headers


class CannotConnect(ConnectionError):
    """Opening a connection to the server failed (refused, unreachable, TLS handshake)."""


class ConnectTimeout(CannotConnect):
    """Opening a connection took longer than ``connect_timeout``."""


class ServerDisconnected(ConnectionError):
    """The connection closed or broke before the full answer arrived."""


class MalformedResponse(ConnectionError):
    """The server's bytes are not an HTTP/1.x response."""


class RequestTimeout(TimeoutError):
    """The request (waiting, connecting, sending and the answer) took longer than ``request_timeout``."""


class Endpoint:
    """One server and path: the prebuilt request head and the server's idle connections."""

    __slots__ = ("url", "host", "port", "tls", "head", "idle", "addresses", "addresses_until", "resolving")

    def __init__(self, url: str, path: str, method: str, headers: dict[str, str]):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
            raise ValueError(f"{url!r}: expected http(s)://host:port")
        host, _ = split_hostport(parts.netloc.rsplit("@", 1)[-1])  # raw: a zone id as fe80::1%eth0
        for name, value in headers.items():
            if any(c in f"{name}{value}" for c in "\r\n\0"):
                raise ValueError(f"HTTP header {name!r} holds a line break or NUL")
        self.url = url
        self.host = host
        self.port = parts.port
        self.tls = parts.scheme == "https"
        lines = [f"{method} {path} HTTP/1.1", f"Host: {parts.netloc.rsplit('@', 1)[-1]}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self.idle: deque[_Connection] = deque()
        try:  # an IP address needs no resolving (a zone id is resolved, to its interface's index)
            ip = ipaddress.ip_address(self.host)
            if "%" in self.host:
                raise ValueError("resolve the zone id")
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            self.addresses: list[tuple[int, str]] | None = [(family, self.host)]
            self.addresses_until = float("inf")
        except ValueError:
            self.addresses = None
            self.addresses_until = 0.0
        self.resolving: asyncio.Future | None = None


class ConnectionPool:
    """Pooled HTTP/1.1 connections, one request at a time on each; see the module docstring."""

    def __init__(self, *, limit: int, request_timeout: float, connect_timeout: float,
                 headers: dict[str, str] | None = None, keepalive_s: float = 4.0, dns_ttl_s: float = 300.0):
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.dns_ttl_s = dns_ttl_s
        self._tick = min(1.0, max(0.005, request_timeout / 20))
        self._loop = asyncio.get_running_loop()
        self._active = 0  # requests holding a slot
        self._waiters: deque[tuple[asyncio.Future, float]] = deque()  # (future, deadline), in arrival order
        self._busy: dict[_Connection, float] = {}  # connection -> its request's deadline
        self._connections: set[_Connection] = set()
        self._endpoints: dict[tuple[str, str, str], Endpoint] = {}
        self._headers = dict(headers or {})
        self._sweeper: asyncio.TimerHandle | None = None
        self._ssl: ssl_module.SSLContext | None = None
        self._closed = False
        self._own_timeouts = False

    def endpoint(self, url: str, path: str, method: str = "POST") -> Endpoint:
        """The endpoint for ``method url+path`` (the same object, with its idle connections, for the same URL)."""
        key = (url, path, method)
        ep = self._endpoints.get(key)
        if ep is None:
            ep = self._endpoints[key] = Endpoint(url, path, method, self._headers)
        return ep

    def forget(self, keep: list[Endpoint]) -> None:
        """Close the idle connections of every endpoint not in ``keep`` (servers that went away)."""
        kept = {id(ep) for ep in keep}
        for key, ep in list(self._endpoints.items()):
            if id(ep) not in kept:
                del self._endpoints[key]
                while ep.idle:
                    ep.idle.pop().close()

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    # -- requests -----------------------------------------------------------------
    async def request(self, ep: Endpoint, body: bytes, timeout: float | None = None) -> tuple[int, bytes]:
        """Send ``body`` to ``ep``; the answer's status and body bytes (within ``timeout``, default
        ``request_timeout``)."""
        if self._closed:
            raise ServerDisconnected("the connection pool is closed")
        loop = self._loop
        limit = self.request_timeout if timeout is None else timeout
        deadline = loop.time() + limit
        if timeout is not None:
            self._own_timeouts = True
        if timeout is not None and timeout / 20 < self._tick:
            self._tick = max(0.005, timeout / 20)  # check often enough for the shortest deadline asked for
            if self._sweeper is not None:
                self._sweeper.cancel()
                self._sweeper = None
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._tick, self._sweep)
        if self._active < self.limit and not self._waiters:
            self._active += 1
        else:
            await self._wait_for_slot(deadline)
        try:
            conn = None
            idle = ep.idle
            while idle:
                candidate = idle.pop()
                if not candidate.closed and loop.time() - candidate.idle_since < self.keepalive_s:
                    conn = candidate
                    break
                candidate.close()
            if conn is None:
                conn = await self._connect(ep, deadline, limit)
            waiter = loop.create_future()
            self._busy[conn] = deadline
            try:
                conn.send(ep.head + b"%d\r\n\r\n" % len(body) + body, waiter)
                answer = await waiter
            except BaseException:
                conn.close()  # its state is unknown (a timeout, a failure, or the caller cancelled)
                raise
            finally:
                del self._busy[conn]
            if conn.reusable and not self._closed:
                conn.idle_since = loop.time()
                idle.append(conn)
            else:
                conn.close()
            return answer
        finally:
            self._release_slot()

    async def _wait_for_slot(self, deadline: float) -> None:
        slot = self._loop.create_future()
        self._waiters.append((slot, deadline))
        try:
            await slot
        except BaseException:
            if slot.done() and not slot.cancelled() and slot.exception() is None:
                self._release_slot()  # handed a slot, then cancelled before using it: pass it on
            raise

    def _release_slot(self) -> None:
        waiters = self._waiters
        while waiters:
            slot, _ = waiters.popleft()
            if not slot.done():
                slot.set_result(None)  # the slot goes straight to the next waiter
                return
        self._active -= 1

    async def _connect(self, ep: Endpoint, deadline: float, total: float) -> _Connection:
        remaining = deadline - self._loop.time()
        limit = min(self.connect_timeout, remaining)
        try:
            return await asyncio.wait_for(self._open(ep), max(limit, 0.0))
        except asyncio.TimeoutError:
            if remaining <= self.connect_timeout:
                raise RequestTimeout(f"no answer within {total:g} s") from None
            raise ConnectTimeout(f"connecting to {ep.host}:{ep.port} took longer than "
                                 f"{self.connect_timeout:g} s") from None

    async def _open(self, ep: Endpoint) -> _Connection:
        loop = self._loop
        tls: Any = None
        if ep.tls:
            if self._ssl is None:
                self._ssl = ssl_module.create_default_context()
            tls = self._ssl
        last: OSError | None = None
        for family, address in await self._resolve(ep):
            try:
                _, conn = await loop.create_connection(
                    lambda: _Connection(self), address, ep.port, family=family, ssl=tls,
                    server_hostname=ep.host if tls is not None else None)
                return conn
            except OSError as exc:
                last = exc
        raise CannotConnect(f"cannot connect to {ep.host}:{ep.port}: {last}") from last

    async def _resolve(self, ep: Endpoint) -> list[tuple[int, str]]:
        if ep.addresses is not None and self._loop.time() < ep.addresses_until:
            return ep.addresses
        if ep.resolving is None:  # one lookup at a time per endpoint; the others wait for it
            ep.resolving = asyncio.ensure_future(self._lookup(ep))
            ep.resolving.add_done_callback(_retrieve)
        resolving = ep.resolving
        try:
            return await asyncio.shield(resolving)
        finally:
            if resolving.done() and ep.resolving is resolving:
                ep.resolving = None

    async def _lookup(self, ep: Endpoint) -> list[tuple[int, str]]:
        try:
            infos = await self._loop.getaddrinfo(ep.host, ep.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise CannotConnect(f"cannot resolve {ep.host}: {exc}") from exc
        addresses = list(dict.fromkeys((int(family), str(sockaddr[0])) for family, _, _, _, sockaddr in infos))
        if not addresses:
            raise CannotConnect(f"cannot resolve {ep.host}: no address")
        ep.addresses, ep.addresses_until = addresses, self._loop.time() + self.dns_ttl_s
        return addresses

    # -- timeouts and idle connections --------------------------------------------
    def _sweep(self) -> None:
        """Fail requests past their deadline and close stale idle connections; runs while there is work."""
        now = self._loop.time()
        for conn, deadline in list(self._busy.items()):
            if deadline <= now:
                conn.fail(RequestTimeout("no answer within the request's timeout"))
        waiters = self._waiters
        if self._own_timeouts:  # requests set their own timeouts: arrival order is not deadline order
            for slot, deadline in list(waiters):
                if deadline <= now and not slot.done():
                    slot.set_exception(RequestTimeout("no free connection within the request's timeout"))
        while waiters and (waiters[0][0].done() or waiters[0][1] <= now):
            slot, _ = waiters.popleft()
            if not slot.done():
                slot.set_exception(RequestTimeout("no free connection within the request's timeout"))
        for ep in self._endpoints.values():
            idle = ep.idle
            while idle and (idle[0].closed or now - idle[0].idle_since >= self.keepalive_s):
                idle.popleft().close()
        if self._busy or self._waiters or self._active or any(ep.idle for ep in self._endpoints.values()):
            self._sweeper = self._loop.call_later(self._tick, self._sweep)
        else:
            self._sweeper = None

    async def close(self) -> None:
        """Close every connection; requests still running fail with :class:`ServerDisconnected`."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        while self._waiters:
            slot, _ = self._waiters.popleft()
            if not slot.done():
                slot.set_exception(ServerDisconnected("the connection pool was closed"))
        for conn in list(self._connections):
            conn.fail(ServerDisconnected("the connection pool was closed"))
        for ep in self._endpoints.values():
            ep.idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing


_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(4)


class _Connection(asyncio.Protocol):
    """One connection: sends a request, frames one answer, then waits idle in its endpoint's deque."""

    __slots__ = ("pool", "transport", "waiter", "buf", "closed", "reusable", "idle_since", "state", "status",
                 "keep_alive", "body_at", "length", "scan", "chunks")

    def __init__(self, pool: ConnectionPool):
        self.pool = pool
        self.transport: Any = None
        self.waiter: asyncio.Future | None = None
        self.buf: bytearray | None = None  # an answer that spans several reads
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.state = _HEAD
        self.status = 0
        self.keep_alive = False
        self.body_at = 0
        self.length = 0
        self.scan = 0
        self.chunks: list[bytes] | None = None

    # -- asyncio callbacks ----------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.pool._connections.add(self)

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        buf = self.buf
        if buf is not None:
            buf += data
            data = buf  # type: ignore[assignment]
        try:
            answer = self._frame(data)
        except MalformedResponse as exc:
            self.fail(exc)
            return
        if answer is not None:
            self.buf = None
            self.waiter = None
            self._reset()
            waiter.set_result(answer)
        elif self.buf is None:
            self.buf = bytearray(data)

    def eof_received(self) -> bool:
        self._finish_at_close()
        self.closed = True  # never reuse it; connection_lost follows
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._connections.discard(self)
        if exc is None:
            self._finish_at_close()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            received = len(self.buf) if self.buf is not None else 0
            why = f": {exc}" if exc is not None else ""
            waiter.set_exception(ServerDisconnected(
                f"the server closed the connection before the full answer ({received} bytes received){why}"))
        self.waiter = None

    # -- used by the pool --------------------------------------------------------
    def send(self, data: bytes, waiter: asyncio.Future) -> None:
        self.waiter = waiter
        self.reusable = False
        self.transport.write(data)

    def fail(self, exc: BaseException) -> None:
        """End the request in flight with ``exc`` and drop the connection."""
        waiter, self.waiter = self.waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()

    # -- framing ---------------------------------------------------------------------
    def _finish_at_close(self) -> None:
        """An answer without a length ends when the server closes the connection."""
        waiter = self.waiter
        if self.state == _UNTIL_CLOSE and waiter is not None and not waiter.done():
            body = bytes(self.buf[self.body_at:]) if self.buf is not None else b""
            self.waiter = None
            self.reusable = False
            waiter.set_result((self.status, body))

    def _frame(self, data: bytes | bytearray) -> tuple[int, bytes] | None:
        """The complete answer in ``data``, or None when more bytes are needed (state kept for the next read)."""
        if self.state == _HEAD:
            end = data.find(b"\r\n\r\n", self.scan)
            if end < 0:
                if len(data) > MAX_HEAD:
                    raise MalformedResponse(f"no end of the response head in {len(data)} bytes")
                self.scan = max(0, len(data) - 3)
                return None
            self._read_head(bytes(data[:end]))
            self.body_at = end + 4
            if 100 <= self.status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
                rest = bytes(data[end + 4:])
                self._reset()
                self.buf = None
                answer = self._frame(rest) if rest else None
                if answer is None and self.buf is None:
                    self.buf = bytearray(rest)  # what follows the interim answer, kept for the next read
                return answer
        state = self.state
        if state == _LENGTH:
            end = self.body_at + self.length
            if len(data) < end:
                return None
            if len(data) > end:  # bytes after the answer: nothing was asked for them
                self.keep_alive = False
            self.reusable = self.keep_alive
            return self.status, bytes(data[self.body_at:end])
        if state == _CHUNKED:
            return self._chunked(data)
        return None  # _UNTIL_CLOSE: see _finish_at_close

    def _read_head(self, head: bytes) -> None:
        lower = head.lower()
        line_end = lower.find(b"\r\n")
        status_line = lower if line_end < 0 else lower[:line_end]
        if (not status_line.startswith(b"http/1.") or len(status_line) < 12 or status_line[8:9] != b" "
                or status_line[12:13] not in (b"", b" ")):
            raise MalformedResponse(f"not an HTTP/1.x status line: {head[:80]!r}")
        try:
            self.status = int(status_line[9:12])
        except ValueError:
            raise MalformedResponse(f"not an HTTP/1.x status line: {head[:80]!r}") from None
        connection = _header(lower, b"\nconnection:")
        if status_line[7:8] == b"1":
            self.keep_alive = connection is None or b"close" not in connection
        else:  # HTTP/1.0 closes unless asked to keep alive
            self.keep_alive = connection is not None and b"keep-alive" in connection
        status = self.status
        if status < 200 or status in (204, 304):
            self.state, self.length = _LENGTH, 0
            return
        encoding = _header(lower, b"\ntransfer-encoding:")
        if encoding is not None:
            if encoding.rsplit(b",", 1)[-1].strip() != b"chunked":
                self.state = _UNTIL_CLOSE
                self.keep_alive = False
                return
            self.state, self.chunks = _CHUNKED, []
            return
        length = _header(lower, b"\ncontent-length:")
        if length is None:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False
            return
        try:
            self.length = int(length)
        except ValueError:
            raise MalformedResponse(f"bad Content-Length {length[:40]!r}") from None
        if self.length < 0:
            raise MalformedResponse(f"bad Content-Length {length[:40]!r}")
        self.state = _LENGTH

    def _chunked(self, data: bytes | bytearray) -> tuple[int, bytes] | None:
        chunks = self.chunks
        assert chunks is not None  # set when the head said chunked
        pos = self.scan if self.scan > self.body_at else self.body_at
        while True:
            line_end = data.find(b"\r\n", pos)
            if line_end < 0:
                if len(data) - pos > 1024:
                    raise MalformedResponse("a chunk size line longer than 1 KiB")
                self.scan = pos
                return None
            size_text = bytes(data[pos:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise MalformedResponse(f"bad chunk size {size_text[:40]!r}") from None
            if size < 0:
                raise MalformedResponse(f"bad chunk size {size_text[:40]!r}")
            if size == 0:  # the last chunk, then optional trailer lines and an empty line
                if data[line_end + 2:line_end + 4] == b"\r\n":
                    end = line_end + 4
                else:
                    end = data.find(b"\r\n\r\n", line_end + 2)
                    if end < 0:
                        self.scan = pos
                        return None
                    end += 4
                if len(data) > end:
                    self.keep_alive = False
                self.reusable = self.keep_alive
                return self.status, b"".join(chunks)
            start = line_end + 2
            stop = start + size
            if len(data) < stop + 2:
                self.scan = pos
                return None
            if data[stop:stop + 2] != b"\r\n":
                raise MalformedResponse("a chunk does not end with CRLF")
            chunks.append(bytes(data[start:stop]))
            pos = stop + 2
            self.scan = pos


def _retrieve(task: asyncio.Future) -> None:
    """Mark a lookup's failure as seen (the requests that awaited it got it)."""
    if not task.cancelled():
        task.exception()


def _header(lower_head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` (given as ``b"\\nname:"``, lower case) in a lower-cased head, or None."""
    at = lower_head.find(name)
    if at < 0:
        return None
    start = at + len(name)
    end = lower_head.find(b"\r\n", start)
    return lower_head[start:end if end >= 0 else len(lower_head)].strip()
