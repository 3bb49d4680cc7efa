"""One live connection to an MCP server, held by a task of its own.

The SDK's clients are anyio context managers, which must be entered and left by the same task. So a
connection is owned by one background task that connects, lists the tools, and then waits to be told
to stop; calls from any task go through the session meanwhile. Every wait is bounded: the start by
``startup_timeout``; a call by the caller's timeout, and it fails at once when the owner task ends
(the server died), never hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import IO, Any

from scaffold_core.errors import MissingDependencyError, ScaffoldError

from .servers import HttpServerProcess, ServerProcessError, ServerSpec, new_log, stderr_tail

#: Seconds the owner task gets to leave its connection (the SDK bounds a stdio server's exit by ~6 s).
CLOSE_TIMEOUT = 15.0


#: The SDK releases this plugin is written against (its ``Client``).
SDK = "2"
SDK_HINT = ("pip install 'mcp>=2,<3' (a server that needs the 1.x SDK runs in an environment of its own: "
            "server: 'uvx <its package>', or server: {command: ..., venv: <its virtual environment>})")


def sdk_problem(*, import_it: bool = True) -> str | None:
    """Why the installed ``mcp`` SDK cannot be used (None: it can): missing, a 1.x release, or one without
    ``Client``. ``import_it=False`` reads the installed version only (quick: ``list-plugins``)."""
    from importlib import metadata

    try:
        version = metadata.version("mcp")
    except metadata.PackageNotFoundError:
        return f"the mcp tool needs the mcp SDK {SDK}.x, which is not installed: {SDK_HINT}"
    if version.split(".", 1)[0] != SDK:
        return f"the mcp tool needs the mcp SDK {SDK}.x; mcp {version} is installed: {SDK_HINT}"
    if not import_it:
        return None
    try:
        from mcp import Client  # noqa: F401 - the SDK 2 client this plugin drives
        from mcp.client.streamable_http import streamable_http_client  # noqa: F401
    except ImportError as exc:
        return (f"the mcp tool needs the mcp SDK {SDK}.x; mcp {version} is installed ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:200]}): {SDK_HINT}")
    return None


def check_sdk() -> None:
    """Raise :class:`MissingDependencyError` in one line when the ``mcp`` SDK cannot be used."""
    problem = sdk_problem()
    if problem:
        raise MissingDependencyError(problem)


class McpStartError(ScaffoldError):
    """The MCP server did not start, or did not list its tools in time; the message says why."""


class McpServerGone(ScaffoldError):
    """A call found no live server (it died or was stopped); the message says what happened."""


def _reason(exc: BaseException) -> str:
    """One line for an error the SDK or the transport raised (exception groups unwrapped)."""
    inner = getattr(exc, "exceptions", None)
    while isinstance(inner, tuple) and inner:  # an exception group: its first exception says why
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ServerProcessError):
        return text
    return f"{type(exc).__name__}: {text}" if not text.startswith(type(exc).__name__) else text


class McpConnection:
    """A server connection that can be started, used from any task, and closed (and started again)."""

    def __init__(self, spec: ServerSpec, *, startup_timeout: float, read_timeout: float):
        self.spec = spec
        self.startup_timeout = startup_timeout
        self.read_timeout = read_timeout
        self.client: Any = None
        self.listed: list[Any] = []
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self._done: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._log: IO[str] | None = None
        self._process: HttpServerProcess | None = None

    @property
    def alive(self) -> bool:
        return self.client is not None and self._done is not None and not self._done.is_set()

    # -- lifetime -----------------------------------------------------------------------
    async def start(self) -> None:
        """Connect (starting the server) and list its tools; :class:`McpStartError` when it cannot."""
        if self.alive:
            return
        await self.close()
        self._stop, self._ready, self._done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._error = None
        self._log = new_log()
        deadline = time.monotonic() + self.startup_timeout
        self._owner = asyncio.create_task(self._own(deadline), name=f"mcp server {self.spec.label}")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout=self.startup_timeout)
        except asyncio.TimeoutError:
            message = self._start_message(f"it did not list its tools within {self.startup_timeout:g} s "
                                          "(raise startup_timeout for a slow server)")
            await self.close(graceful=False)  # it is not listening: no reason to wait for it to wind down
            raise McpStartError(message) from None
        if self.client is None:
            await self._settle()  # the server's exit first: its last words reach the log
            reason = _reason(self._error) if self._error is not None else "it stopped before listing its tools"
            message = self._start_message(reason)
            await self.close()
            raise McpStartError(message)

    async def _settle(self) -> None:
        """Wait (bounded) for the owner task to finish on its own."""
        if self._owner is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self._owner), timeout=CLOSE_TIMEOUT)

    def _start_message(self, reason: str) -> str:
        tail = stderr_tail(self._log)
        return (f"MCP server {self.spec.label} failed to start: {reason}" + (f"; its stderr: {tail}" if tail else "")
                + "; check the server option (the command runs from the current directory)")

    async def _own(self, deadline: float) -> None:
        from mcp import Client, StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        assert self._stop is not None and self._ready is not None and self._done is not None
        try:
            if self.spec.url is None:
                transport: Any = stdio_client(StdioServerParameters(
                    command=self.spec.command[0], args=list(self.spec.command[1:]), env=self.spec.env or None,
                    cwd=self.spec.cwd), errlog=self._log)  # type: ignore[arg-type]
            else:
                if self.spec.command:
                    self._process = HttpServerProcess(self.spec, self._log)  # type: ignore[arg-type]
                    await self._process.start(deadline)
                transport = streamable_http_client(self.spec.url)
            async with Client(transport, read_timeout_seconds=self.read_timeout) as client:
                self.listed = await _list_tools(client)
                self.client = client
                self._ready.set()
                await self._stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the server failed: kept for messages, never raised into the loop
            self._error = exc
        finally:
            self.client = None
            self._done.set()
            self._ready.set()
            if self._process is not None:
                await asyncio.shield(self._process.stop())
                self._process = None

    async def close(self, *, graceful: bool = True) -> None:
        """Disconnect and stop the server (waits for the process to exit, bounded). Safe twice.

        ``graceful=False`` cancels the connection at once instead of letting it end its session first (a
        server that never answered)."""
        owner, self._owner = self._owner, None
        if owner is not None:
            if self._stop is not None:
                self._stop.set()
            if not graceful:
                owner.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(owner), timeout=CLOSE_TIMEOUT)
            except asyncio.TimeoutError:
                owner.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(owner, timeout=CLOSE_TIMEOUT)
            except BaseException:  # noqa: BLE001 - the owner's own failure was recorded in _error
                pass
        if self._process is not None:
            await self._process.stop()
            self._process = None
        self.client = None
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- calls ------------------------------------------------------------------------------
    def gone_message(self) -> str:
        if self._error is not None:
            why = _reason(self._error)
        elif self._done is not None and self._done.is_set():
            why = "the connection was closed"
        else:
            why = "it was not started"
        tail = stderr_tail(self._log)
        return f"MCP server {self.spec.label} is not running ({why})" + (f"; its stderr: {tail}" if tail else "")

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """The server's ``CallToolResult``; :class:`McpServerGone` at once if the server is (or goes) away."""
        client, done = self.client, self._done
        if client is None or done is None or done.is_set():
            raise McpServerGone(self.gone_message())
        call = asyncio.ensure_future(client.call_tool(name, arguments))
        ended = asyncio.ensure_future(done.wait())
        try:
            await asyncio.wait({call, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            if not call.done():
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call
        if call.cancelled():
            raise McpServerGone(self.gone_message())
        error = call.exception()
        if error is not None:
            if done.is_set():
                raise McpServerGone(self.gone_message())
            raise error
        return call.result()


async def _list_tools(client: Any) -> list[Any]:
    """Every tool the server lists (following pagination, at most 100 pages)."""
    tools: list[Any] = []
    cursor = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
        tools.extend(page.tools)
        cursor = getattr(page, "next_cursor", None)
        if not cursor:
            break
    return tools
