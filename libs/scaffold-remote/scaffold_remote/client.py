"""The HTTP client of a remote engine: pooled keep-alive connections, bounded requests, retries with backoff.

* Generation requests go through one lean connection pool (:mod:`.http`, at
  most ``max_connections`` at once), the control endpoints (health, pause,
  weight updates) through a second, small one: a pause never waits behind a
  thousand generations for a connection. Both are made on the running loop.
* Every request is bounded by ``request_timeout`` (and connecting by
  ``connect_timeout``); a control call by its own timeout.
* Connection errors, dropped connections, HTTP 429 and 5xx are retried with
  exponential backoff and jitter, up to ``max_retries`` times, inside one
  :meth:`RemoteClient.generate` call: the caller (the runtime, an episode)
  sees one result or one error, never a second copy of a sample. Each
  attempt has a fresh request id (servers refuse a duplicate live id, and
  SGLang matches aborts by prefix) and the same sampling seed, so a retried
  seeded request samples the same tokens. Other 4xx answers are the
  caller's fault and are not retried.
* ``Authorization: Bearer`` is sent when an API key is configured; the key is
  never logged or put in an error message.

What differs between servers (the request body, the response, the path) is a
:class:`WireProtocol`, which each server engine plugin implements.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
from typing import Any

import orjson

from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest, GenerationResult

from .http import ConnectionPool, ConnectTimeout
from .servers import Server, ServerPool

log = logging.getLogger("scaffold.remote")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
CONTROL_CONNECTIONS = 32


class ProtocolError(ValueError):
    """A response that does not follow the server's protocol (missing or inconsistent fields)."""


class WireProtocol:
    """One server's generation wire format: what a server engine plugin implements.

    ``encode`` turns a request into the body of ``POST generate_path`` (with
    the attempt's request id ``rid``); ``parse`` turns a 200 answer to it into
    a :class:`GenerationResult` (raising :class:`ProtocolError` or
    ``ValueError`` for an answer it cannot use). ``meta["server_text"]``
    says whether ``text`` came from the server (else the engine decodes the
    ids). ``explain`` adds a hint to the error of a refused request.
    """

    name = "remote"
    generate_path = "/generate"

    def encode(self, request: GenerationRequest, rid: str) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def parse(self, payload: bytes, rid: str, request: GenerationRequest) -> GenerationResult:  # pragma: no cover
        raise NotImplementedError

    def explain(self, status: int, message: str) -> str:
        """A hint for a refused request (``""``: none)."""
        return ""


class RemoteClient:
    """Talks to one or more inference servers over HTTP: generation and the control endpoints."""

    def __init__(self, urls: list[str], protocol: WireProtocol, *, api_key: str | None = None,
                 api_key_env: str = "the engine's api_key_env", request_timeout: float = 600.0,
                 connect_timeout: float = 10.0, max_retries: int = 4, retry_backoff: float = 0.5,
                 retry_backoff_max: float = 8.0, max_connections: int = 1024, sticky: bool = True):
        self.pool = ServerPool(urls, sticky=sticky)
        self.protocol = protocol
        self.api_key_env = api_key_env
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = retry_backoff_max
        self.max_connections = max_connections
        # Request ids: 32 hex digits, a random per-client prefix and a counter (unique across clients with
        # overwhelming probability). SGLang matches aborts by prefix; no fixed-length id prefixes another.
        self._rid_prefix = os.urandom(8).hex()
        self._rid_counter = itertools.count()
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._http: ConnectionPool | None = None
        self._control: ConnectionPool | None = None
        self.stats = {"requests": 0, "retries": 0, "connection_errors": 0, "http_errors": 0, "timeouts": 0,
                      "aborted": 0, "null_logprobs": 0}

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.pool.servers]

    def set_urls(self, urls: list[str]) -> None:
        """Replace the servers (e.g. a launched server restarted on another port before it was ready)."""
        self.pool = ServerPool(urls, sticky=self.pool.sticky)
        if self._http is not None:
            self._bind_endpoints(self._http)

    def set_protocol(self, protocol: WireProtocol) -> None:
        """Generate through another wire format (e.g. a fallback endpoint the servers do have)."""
        self.protocol = protocol
        if self._http is not None:
            self._bind_endpoints(self._http)

    def _bind_endpoints(self, http: ConnectionPool) -> None:
        for server in self.pool.servers:
            server.endpoint = http.endpoint(server.url, self.protocol.generate_path)
        http.forget([server.endpoint for server in self.pool.servers])

    # -- lifecycle ------------------------------------------------------------
    async def open(self) -> None:
        """Create the two connection pools on the running loop."""
        if self._http is not None:
            return
        self._http = ConnectionPool(limit=self.max_connections, request_timeout=self.request_timeout,
                                    connect_timeout=self.connect_timeout, headers=self._headers)
        self._control = ConnectionPool(limit=CONTROL_CONNECTIONS, request_timeout=self.request_timeout,
                                       connect_timeout=self.connect_timeout, headers=self._headers)
        self._bind_endpoints(self._http)

    async def close(self) -> None:
        http, self._http = self._http, None
        control, self._control = self._control, None
        try:
            if http is not None:
                await http.close()
        finally:
            if control is not None:
                await control.close()

    # -- generation ---------------------------------------------------------
    def _backoff(self, attempt: int) -> float:
        base = min(self.retry_backoff_max, self.retry_backoff * (2 ** attempt))
        return base * (0.5 + random.random() / 2)

    def new_rid(self) -> str:
        """A fresh request id: 32 hex digits, unique across attempts and clients."""
        return f"{self._rid_prefix}{next(self._rid_counter):016x}"

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """One generation for ``request``, retried on connection errors, dropped connections and 5xx."""
        http = self._http
        protocol = self.protocol
        name = protocol.name
        if http is None:
            raise EngineError(f"the {name} engine is not started: await engine.start() first", retryable=False)
        self.stats["requests"] += 1
        last = ""
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            server = self.pool.pick(request.episode_id)
            rid = self.new_rid()
            data = protocol.encode(request, rid)
            server.in_flight += 1
            server.requests += 1
            try:
                try:
                    status, payload = await http.request(server.endpoint, data)
                finally:
                    server.in_flight -= 1
            except ConnectTimeout:
                self.stats["connection_errors"] += 1
                self.pool.mark_down(server)
                last = f"connecting to {server.url} took longer than {self.connect_timeout:g} s (connect_timeout)"
            except (asyncio.TimeoutError, TimeoutError):
                self.stats["timeouts"] += 1
                raise EngineError(
                    f"{name} server {server.url} did not answer request {request.request_id} within "
                    f"{self.request_timeout:g} s (engine.request_timeout)", retryable=True) from None
            except OSError as exc:  # refused, reset, closed before the full answer, not HTTP
                self.stats["connection_errors"] += 1
                self.pool.mark_down(server)
                last = f"{server.url}: {type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    try:
                        result = protocol.parse(payload, rid, request)
                    except ValueError as exc:  # ProtocolError, or a body that is not JSON
                        raise EngineError(f"{name} server {server.url} sent a response scaffold cannot use for "
                                          f"request {request.request_id}: {exc}", retryable=False) from None
                    if result.finish_reason == "abort":
                        self.stats["aborted"] += 1
                    if "null_logprobs" in result.meta:
                        self.stats["null_logprobs"] += result.meta["null_logprobs"]
                    if server.consecutive_failures:
                        self.pool.mark_up(server)
                    result.meta["server"] = server.url
                    result.meta["attempts"] = attempt + 1
                    return result
                self.stats["http_errors"] += 1
                message = error_message(status, payload)
                if status not in RETRY_STATUSES:
                    text = f"{name} server {server.url} refused request {request.request_id}: {message}"
                    raise EngineError(text + protocol.explain(status, message) + self.status_hint(status),
                                      retryable=False)
                last = f"{server.url}: {message}"
            if attempt + 1 < attempts:
                self.stats["retries"] += 1
                log.debug("retrying request %s after: %s", request.request_id, last)
                await asyncio.sleep(self._backoff(attempt))
        raise EngineError(f"{name} request {request.request_id} failed after {attempts} attempt(s) "
                          f"(engine.max_retries={self.max_retries}); last error: {last}", retryable=True)

    def status_hint(self, status: int) -> str:
        """What to do about an authentication failure (empty for other statuses)."""
        if status == 401:
            return (f"; the server needs an API key: put it in the environment variable named by "
                    f"engine.api_key_env ({self.api_key_env})")
        if status == 403:
            return "; this endpoint needs the server's admin API key"
        return ""

    # -- control endpoints ----------------------------------------------------
    async def call(self, server: Server, method: str, path: str, payload: Any = None,
                   timeout: float | None = None) -> tuple[int, bytes]:
        """One control call (no retries: these change server state); (status, body)."""
        control = self._control
        name = self.protocol.name
        if control is None:
            raise EngineError(f"the {name} engine is not started: await engine.start() first", retryable=False)
        limit = timeout or self.request_timeout
        body = b"" if method == "GET" else encode_json({} if payload is None else payload)
        try:
            return await control.request(control.endpoint(server.url, path, method), body, limit)
        except (asyncio.TimeoutError, TimeoutError):
            raise EngineError(f"{method} {server.url}{path} did not answer within {limit:g} s",
                              retryable=True) from None
        except OSError as exc:
            raise EngineError(f"{method} {server.url}{path} failed: {type(exc).__name__}: {exc}",
                              retryable=True) from None

    async def call_all(self, method: str, path: str, payload: Any = None, *, timeout: float | None = None,
                       expect_success: bool = False, hint: str = "") -> list[Any]:
        """The same control call on every server, concurrently; raises naming each server that failed.

        ``expect_success``: a 200 answer of ``{"success": false, ...}`` is a failure too. ``hint`` is added
        to the error (what to do about it).
        """
        servers = self.pool.servers
        outcomes = await asyncio.gather(*(self.call(s, method, path, payload, timeout) for s in servers),
                                        return_exceptions=True)
        results: list[Any] = []
        failures: list[str] = []
        for server, outcome in zip(servers, outcomes):
            if isinstance(outcome, BaseException):
                failures.append(str(outcome))
                continue
            status, body = outcome
            data = json_or_text(body)
            ok = status == 200 and not (expect_success and isinstance(data, dict) and data.get("success") is False)
            if not ok:
                failures.append(f"{server.url}{path}: {error_message(status, body)}{self.status_hint(status)}")
            results.append(data)
        if failures:
            raise EngineError(f"{path} failed on {len(failures)} of {len(servers)} server(s): "
                              + "; ".join(failures) + hint, retryable=False)
        return results

    async def get_json(self, server: Server, path: str, timeout: float | None = None) -> Any:
        status, body = await self.call(server, "GET", path, timeout=timeout)
        if status != 200:
            raise EngineError(f"GET {server.url}{path}: {error_message(status, body)}{self.status_hint(status)}",
                              retryable=False)
        return json_or_text(body)

    async def probe(self, url: str, path: str, timeout: float) -> str | None:
        """GET ``url + path``; None when it answers 200, else why not (for readiness polling)."""
        control = self._control
        if control is None:
            return "the client is closed"
        try:
            status, _ = await control.request(control.endpoint(url, path, "GET"), b"", timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return f"{path} did not answer within {timeout:g} s"
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if status == 200 else f"{path} answered HTTP {status}"


def error_message(status: int, payload: bytes | str) -> str:
    """The human message of an error response, whichever shape its body has.

    ``{"error": {"message": ...}}`` (SGLang, vLLM's ``ErrorResponse``),
    ``{"error": "..."}``, the OpenAI-style ``{"object": "error", "message":
    ...}``, the control endpoints' ``{"success": false, "message": ...}``,
    FastAPI's ``{"detail": ...}``, or plain text.
    """
    text = payload.decode("utf-8", errors="replace") if isinstance(payload, bytes) else str(payload)
    message: Any = None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            message = err.get("message") or json.dumps(err)
        elif isinstance(err, str):
            message = err
        elif data.get("object") == "error" or "message" in data:
            message = data.get("message")
        elif "detail" in data:
            detail = data["detail"]
            message = detail if isinstance(detail, str) else json.dumps(detail)
    if message is None:
        message = text.strip() or "(empty body)"
    message = str(message)
    if len(message) > 1000:
        message = message[:1000] + "..."
    return f"HTTP {status}: {message}"


_COMPACT = json.JSONEncoder(separators=(",", ":"))


def decode_json(payload: bytes | str) -> Any:
    """Parse a response body: orjson, or the stdlib for what only it accepts (NaN literals, huge ints)."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)


def encode_ids(ids: Any) -> bytes:
    """The JSON array of token ids (a list or tuple of ints, numpy integers, or a numpy array)."""
    try:
        return orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # something orjson does not know (e.g. another int-like type): its str() is its JSON
        return b"[" + ",".join(map(str, ids)).encode() + b"]"


def encode_json(data: Any) -> bytes:
    """Compact JSON bytes (what the client sends)."""
    return _COMPACT.encode(data).encode()


def json_or_text(body: bytes) -> Any:
    """A response body as JSON, else as text (``None`` when empty)."""
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")
