"""The HTTP client: pooled keep-alive connections, bounded requests, retries with backoff.

* ``/generate`` goes through a lean HTTP/1.1 connection pool
  (:mod:`.http_pool`, at most ``max_connections`` requests at once); the
  control endpoints through one aiohttp session. Both are created on the
  running event loop.
* Every request is bounded by ``request_timeout`` (and connecting by
  ``connect_timeout``).
* Connection errors, dropped connections, HTTP 5xx and 429 are retried with
  exponential backoff and jitter, up to ``max_retries`` times; each attempt
  has a fresh ``rid`` (SGLang refuses a duplicate live rid and matches aborts
  by prefix). Other 4xx answers are the caller's fault and are not retried.
* ``Authorization: Bearer`` is sent when an API key is configured; the key is
  never logged or put in an error message.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
from typing import Any

from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest, GenerationResult

from .http_pool import ConnectionPool, ConnectTimeout
from .protocol import (
    BodyEncoder,
    ProtocolError,
    decode_json,
    encode_json,
    error_message,
    parse_generate_response,
)
from .servers import Server, ServerPool

log = logging.getLogger("scaffold.sglang")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class SGLangClient:
    """Talks to one or more SGLang servers over HTTP (``/generate`` and the control endpoints)."""

    def __init__(self, urls: list[str], *, api_key: str | None = None, request_timeout: float = 600.0,
                 connect_timeout: float = 10.0, max_retries: int = 4, retry_backoff: float = 0.5,
                 retry_backoff_max: float = 8.0, max_connections: int = 1024, sticky: bool = True,
                 send_seed: bool = False, extra_sampling: dict[str, Any] | None = None):
        self.pool = ServerPool(urls, sticky=sticky)
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = retry_backoff_max
        self.max_connections = max_connections
        self._encoder = BodyEncoder(send_seed=send_seed, extra_sampling=extra_sampling)
        # Request ids: 32 hex digits, a random per-client prefix and a counter (unique across clients with
        # overwhelming probability). SGLang matches aborts by prefix; no fixed-length id prefixes another.
        self._rid_prefix = os.urandom(8).hex()
        self._rid_counter = itertools.count()
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: Any = None
        self._aiohttp: Any = None
        self._timeout: Any = None
        self._http: ConnectionPool | None = None
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

    def _bind_endpoints(self, http: ConnectionPool) -> None:
        for server in self.pool.servers:
            server.endpoint = http.endpoint(server.url, "/generate")
        http.forget([server.endpoint for server in self.pool.servers])

    # -- lifecycle ------------------------------------------------------------
    async def open(self) -> None:
        """Create the connection pool and the control session on the running loop (imports aiohttp here)."""
        if self._session is not None:
            return
        import aiohttp

        self._aiohttp = aiohttp
        self._timeout = aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=self.connect_timeout)
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300,
                                         enable_cleanup_closed=False)
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers, timeout=self._timeout,
            cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"), raise_for_status=False,
        )
        self._http = ConnectionPool(limit=self.max_connections, request_timeout=self.request_timeout,
                                    connect_timeout=self.connect_timeout, headers=self._headers)
        self._bind_endpoints(self._http)

    async def close(self) -> None:
        http, self._http = self._http, None
        session, self._session = self._session, None
        try:
            if http is not None:
                await http.close()
        finally:
            if session is not None:
                await session.close()

    # -- generation ---------------------------------------------------------
    def _backoff(self, attempt: int) -> float:
        base = min(self.retry_backoff_max, self.retry_backoff * (2 ** attempt))
        return base * (0.5 + random.random() / 2)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """One ``/generate`` call for ``request``, retried on connection errors and 5xx."""
        http = self._http
        if http is None:
            raise EngineError("the sglang engine is not started: await engine.start() first", retryable=False)
        self.stats["requests"] += 1
        last = ""
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            server = self.pool.pick(request.episode_id)
            rid = f"{self._rid_prefix}{next(self._rid_counter):016x}"
            data = self._encoder.encode(request, rid)
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
                    f"sglang server {server.url} did not answer request {request.request_id} within "
                    f"{self.request_timeout:g} s (engine.request_timeout)", retryable=True) from None
            except OSError as exc:  # refused, reset, closed before the full answer, not HTTP
                self.stats["connection_errors"] += 1
                self.pool.mark_down(server)
                last = f"{server.url}: {type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    try:
                        result = parse_generate_response(decode_json(payload), expect_rid=rid)
                    except (ValueError, ProtocolError) as exc:
                        raise EngineError(f"sglang server {server.url} sent a response scaffold cannot use for "
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
                    raise EngineError(self._explain(server, request, status, message), retryable=False)
                last = f"{server.url}: {message}"
            if attempt + 1 < attempts:
                self.stats["retries"] += 1
                log.debug("retrying request %s after: %s", request.request_id, last)
                await asyncio.sleep(self._backoff(attempt))
        raise EngineError(f"sglang request {request.request_id} failed after {attempts} attempt(s) "
                          f"(engine.max_retries={self.max_retries}); last error: {last}", retryable=True)

    def _explain(self, server: Server, request: GenerationRequest, status: int, message: str) -> str:
        text = f"sglang server {server.url} refused request {request.request_id}: {message}"
        if status == 400 and "unknown field" in message:
            text += "; a sampling parameter is not supported by this SGLang version (see engine.sampling_extra)"
        return text + status_hint(status)

    # -- control endpoints ----------------------------------------------------
    async def call(self, server: Server, method: str, path: str, payload: Any = None,
                   timeout: float | None = None) -> tuple[int, bytes]:
        """One control call (no retries: these change server state)."""
        if self._session is None:
            raise EngineError("the sglang engine is not started: await engine.start() first", retryable=False)
        aiohttp = self._aiohttp
        kwargs: dict[str, Any] = {"timeout": aiohttp.ClientTimeout(total=timeout or self.request_timeout,
                                                                   sock_connect=self.connect_timeout)}
        if method != "GET":
            kwargs["data"] = encode_json({} if payload is None else payload)
        try:
            async with self._session.request(method, server.url + path, **kwargs) as resp:
                return resp.status, await resp.read()
        except (asyncio.TimeoutError, TimeoutError):
            raise EngineError(f"{method} {server.url}{path} did not answer within "
                              f"{timeout or self.request_timeout:g} s", retryable=True) from None
        except aiohttp.ClientError as exc:
            raise EngineError(f"{method} {server.url}{path} failed: {type(exc).__name__}: {exc}",
                              retryable=True) from None

    async def call_all(self, method: str, path: str, payload: Any = None, *, timeout: float | None = None,
                       expect_success: bool = False) -> list[Any]:
        """The same control call on every server, concurrently; raises naming each server that failed."""
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
            data = _json_or_text(body)
            ok = status == 200 and not (expect_success and isinstance(data, dict) and data.get("success") is False)
            if not ok:
                failures.append(f"{server.url}{path}: {error_message(status, body)}{status_hint(status)}")
            results.append(data)
        if failures:
            raise EngineError(f"{path} failed on {len(failures)} of {len(servers)} server(s): "
                              + "; ".join(failures), retryable=False)
        return results

    async def get_json(self, server: Server, path: str, timeout: float | None = None) -> Any:
        status, body = await self.call(server, "GET", path, timeout=timeout)
        if status != 200:
            raise EngineError(f"GET {server.url}{path}: {error_message(status, body)}{status_hint(status)}",
                              retryable=False)
        return _json_or_text(body)

    async def probe(self, url: str, path: str, timeout: float) -> str | None:
        """GET ``url + path``; None when it answers 200, else why not (for readiness polling)."""
        aiohttp = self._aiohttp
        try:
            async with self._session.get(url + path, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await resp.read()
                return None if resp.status == 200 else f"{path} answered HTTP {resp.status}"
        except (asyncio.TimeoutError, TimeoutError):
            return f"{path} did not answer within {timeout:g} s"
        except aiohttp.ClientError as exc:
            return f"{type(exc).__name__}: {exc}"


def status_hint(status: int) -> str:
    """What to do about an authentication failure (empty for other statuses)."""
    if status == 401:
        return ("; the server needs an API key: put it in the environment variable named by engine.api_key_env "
                "(default SGLANG_API_KEY)")
    if status == 403:
        return "; this endpoint needs the server's admin API key (--admin-api-key)"
    return ""


def _json_or_text(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")
