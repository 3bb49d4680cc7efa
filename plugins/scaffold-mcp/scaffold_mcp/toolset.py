"""The ``mcp`` tool: an MCP server's tools, as scaffold tools.

``tools: [{name: mcp, server: "python my_server.py"}]`` in an agent's config gives the model every tool
the server lists: the names, descriptions and JSON Schemas are the server's. The server is started
when the run starts (its tools are listed then) and stopped when it ends, a failed run too.

``scope: run`` (the default) starts one server for the run, which every episode shares; ``scope: episode``
gives each episode (each parallel branch too) a server of its own, started at its first call and stopped when
the episode is done (at the latest when the run ends), as verifiers scopes tool servers per rollout: what one
episode writes (a database, files) is never what another reads.

A call goes to the server with the tool's timeout. What comes back is the text of the result's content
(an image or other non-text block is named, not shown); a result the server flags as an error is a
failed :class:`~scaffold_core.tool.ToolResult`. A server that died mid-run answers every later call
with a failed result at once (the episode goes on; the run does not fail); a server that cannot start
fails the run's start with one line saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import weakref
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt
from pydantic import StringConstraints

from scaffold_core.plugins import Help
from scaffold_core.tool import DEFAULT_TIMEOUT, NAME_PATTERN, Tool, ToolCallError, ToolContext, ToolResult, ToolSet

from .connection import McpConnection, McpServerGone, McpStartError, check_sdk
from .servers import parse_server

__all__ = ["McpServerGone", "McpStartError", "McpTool", "McpToolSet"]


class McpToolSet(ToolSet):
    """The tools of one MCP server (see the module docstring).

    Options:

    * ``server``: a stdio command (``"python my_server.py"`` or a list), a URL of a streamable-HTTP
      server, or ``{command, args, env, cwd, url}``: a command with a ``url`` is an HTTP server started
      with the run (``{port}`` in both is replaced by a free loopback port).
    * ``tools``: only these of the server's tools (default: all); ``exclude``: not these.
    * ``prefix``: put before every tool name (``fs_``), to tell two servers' tools apart.
    * ``timeout``: seconds one call may take (default 30).
    * ``startup_timeout``: seconds the server gets to start and list its tools (default 60).
    * ``max_output_chars``: a result's text is cut to this many characters (default 20,000), with a note
      saying so, so one call cannot flood the conversation.
    * ``scope``: ``run`` (default: one server for the run) or ``episode`` (a server per episode).
    """

    name = "mcp"

    def __init__(self, server: Annotated[str | list[str] | dict[str, Any], Help("a command, a URL or a dict")],
                 tools: Annotated[list[str] | None, Help("only these of the server's tools")] = None,
                 exclude: Annotated[list[str] | None, Help("not these")] = None,
                 prefix: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{0,32}$"),
                                   Help("put before every tool name")] = "",
                 timeout: Annotated[float, Gt(0), Help("seconds one call may take")] = 30.0,
                 startup_timeout: Annotated[float, Gt(0), Help("seconds to start and list the tools")] = 60.0,
                 max_output_chars: Annotated[int, Ge(100), Help("a result's text is cut to this")] = 20_000,
                 scope: Annotated[Literal["run", "episode"], Help("one server for the run, or one per episode")]
                 = "run"):
        check_sdk()
        self.scope = scope
        self.spec = parse_server(server)
        self.include = list(tools) if tools is not None else None
        self.exclude = set(exclude or [])
        self.prefix = prefix
        self.timeout = float(timeout)
        self.startup_timeout = float(startup_timeout)
        self.max_output_chars = max_output_chars
        self.connection: McpConnection | None = None
        self._tools: list[McpTool] | None = None
        self._users = 0
        #: Servers of episodes still open (``scope: episode``): stopped with the run at the latest.
        self._episodes: set[McpConnection] = set()
        self._state_key = f"mcp-server-{id(self):x}"

    async def start(self) -> None:
        """Start the server and list its tools (once; later starts by the tools themselves share it)."""
        self._users += 1
        if self.connection is not None and self.connection.alive:
            return
        spec = self.spec.with_free_port()
        self.connection = McpConnection(spec, startup_timeout=self.startup_timeout,
                                        read_timeout=self.timeout + 5.0)
        await self.connection.start()
        self._tools = self._make_tools(self.connection.listed)
        if self.scope == "episode":  # it only listed the tools: each episode starts its own
            connection, self.connection = self.connection, None
            await connection.close()

    async def close(self) -> None:
        """Stop the server once its last user closes (the set itself or one of its tools), and every episode's
        server still running. Safe twice."""
        self._users = max(0, self._users - 1)
        if self._users:
            return
        if self.connection is not None:
            await self.connection.close()
        episodes, self._episodes = list(self._episodes), set()
        await asyncio.gather(*(c.close() for c in episodes), return_exceptions=True)

    async def _connection_for(self, context: ToolContext | None) -> McpConnection | None:
        """The server this call goes to: the run's, or (``scope: episode``) the episode's own, started now if
        it is not running. Raises :class:`McpStartError` when an episode's server cannot start."""
        if self.scope == "run" or context is None:
            return self.connection
        holder = context.state.get(self._state_key)
        if not isinstance(holder, EpisodeServer) or holder.owner is not self:
            holder = context.state[self._state_key] = EpisodeServer(self)
        return await holder.connection()

    def tools(self) -> list[Tool]:
        if self._tools is None:
            raise RuntimeError("the mcp tool set lists its tools when it starts: await start() first")
        return list(self._tools)

    def _make_tools(self, listed: list[Any]) -> list[McpTool]:
        offered = {t.name: t for t in listed}
        if self.include is not None:
            missing = [n for n in self.include if n not in offered]
            if missing:
                raise McpStartError(f"MCP server {self.spec.label} has no tool {', '.join(map(repr, missing))}; it "
                                    f"lists: {', '.join(offered) or '(none)'}")
        names = self.include if self.include is not None else list(offered)
        made = [McpTool(self, offered[n]) for n in names if n not in self.exclude]
        if not made:
            raise McpStartError(f"MCP server {self.spec.label} offers no tool to use (it lists: "
                                f"{', '.join(offered) or '(none)'})")
        return made

    async def call_remote(self, remote_name: str, arguments: dict[str, Any],
                          context: ToolContext | None = None) -> ToolResult:
        """Call the server's tool ``remote_name`` (the episode's server with ``scope: episode``); a failed result
        (never an exception) when it is gone or cannot start."""
        try:
            connection = await self._connection_for(context)
        except McpStartError as exc:
            return ToolResult.failure("failed", str(exc))
        if connection is None:
            return ToolResult.failure("failed", f"MCP server {self.spec.label} is not running (not started)")
        label = connection.spec.label
        try:
            result = await connection.call(remote_name, arguments)
        except McpServerGone as exc:
            return ToolResult.failure("failed", str(exc))
        except ToolCallError:
            raise
        except Exception as exc:
            text = " ".join(str(exc).split())
            return ToolResult.failure("failed", f"MCP server {label}: {type(exc).__name__}: {text}")
        return _result(result, self.max_output_chars)


class McpTool(Tool):
    """One of a server's tools: its definition is the server's, its calls go to the server."""

    def __init__(self, owner: McpToolSet, listed: Any):
        self.owner = owner
        self.remote_name = str(listed.name)
        self.name = _tool_name(owner.prefix + self.remote_name)
        description = (getattr(listed, "description", None) or "").strip()
        self.description = description or f"The {self.remote_name!r} tool of an MCP server."
        schema = getattr(listed, "input_schema", None)
        self.parameters = dict(schema) if isinstance(schema, dict) else {"type": "object", "properties": {}}
        self.parameters.setdefault("type", "object")
        self.timeout = owner.timeout or DEFAULT_TIMEOUT

    async def start(self) -> None:
        await self.owner.start()

    async def close(self) -> None:
        await self.owner.close()

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        result = await self.owner.call_remote(self.remote_name, arguments, context)
        result.metadata.setdefault("mcp_tool", self.remote_name)
        return result


class EpisodeServer:
    """An episode's own server (``scope: episode``), kept in the episode's tool state.

    Started at the episode's first call; stopped when the episode's state is let go (the episode is done) and at
    the latest when the run ends. A copy (a parallel branch's state) is a server of its own, started when the
    branch first calls."""

    def __init__(self, owner: McpToolSet):
        self.owner = owner
        self._box: list[McpConnection] = []
        self._lock = asyncio.Lock()
        weakref.finalize(self, _stop_later, self._box, owner._episodes, asyncio.get_running_loop())

    def __deepcopy__(self, memo: dict[int, Any]) -> EpisodeServer:
        return EpisodeServer(self.owner)

    def __copy__(self) -> EpisodeServer:
        return EpisodeServer(self.owner)

    async def connection(self) -> McpConnection:
        async with self._lock:
            if self._box and self._box[0].alive:
                return self._box[0]
            owner = self.owner
            connection = McpConnection(owner.spec.with_free_port(), startup_timeout=owner.startup_timeout,
                                       read_timeout=owner.timeout + 5.0)
            owner._episodes.add(connection)
            self._box[:] = [connection]
            await connection.start()
            return connection


def _stop_later(box: list[McpConnection], running: set[McpConnection], loop: asyncio.AbstractEventLoop) -> None:
    """Stop an episode's server once its episode let it go (called by the garbage collector, from any thread)."""
    if not box or loop.is_closed():
        return
    connection = box[0]

    def stop() -> None:
        if connection in running:
            running.discard(connection)
            loop.create_task(connection.close())

    with contextlib.suppress(RuntimeError):  # the loop is closing: the run's close stops it
        loop.call_soon_threadsafe(stop)


def _tool_name(name: str) -> str:
    """A name models may call: characters other than letters, digits, ``_`` and ``-`` become ``_``."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "tool"
    assert NAME_PATTERN.match(cleaned)
    return cleaned


def _result(result: Any, limit: int) -> ToolResult:
    """A ToolResult from the server's CallToolResult: its text blocks joined (cut to ``limit`` characters);
    an error result failed."""
    parts = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
        else:
            kind = getattr(block, "type", type(block).__name__)
            mime = getattr(block, "mime_type", None)
            parts.append(f"[{kind}{' ' + mime if mime else ''} content]")
    content = "\n".join(parts)
    structured = getattr(result, "structured_content", None)
    if not content and structured is not None:
        content = json.dumps(structured, ensure_ascii=False)
    if len(content) > limit:
        content = content[:limit] + f"\n[output cut: {len(content)} characters, the first {limit} shown]"
    if getattr(result, "is_error", False):
        return ToolResult.failure("failed", content or "the MCP tool reported an error")
    return ToolResult(content=content)
