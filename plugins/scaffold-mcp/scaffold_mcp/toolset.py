"""The ``mcp`` tool: an MCP server's tools, as scaffold tools.

``tools: [{name: mcp, server: "python my_server.py"}]`` in an agent's config gives the model every tool
the server lists: the names, descriptions and JSON Schemas are the server's. The server is started
when the run starts (its tools are listed then) and stopped when it ends, a failed run too.

A call goes to the server with the tool's timeout. What comes back is the text of the result's content
(an image or other non-text block is named, not shown); a result the server flags as an error is a
failed :class:`~scaffold_core.tool.ToolResult`. A server that died mid-run answers every later call
with a failed result at once (the episode goes on; the run does not fail); a server that cannot start
fails the run's start with one line saying why.
"""

from __future__ import annotations

import json
import re
from typing import Any

from scaffold_core.tool import DEFAULT_TIMEOUT, NAME_PATTERN, Tool, ToolCallError, ToolContext, ToolResult, ToolSet

from .connection import McpConnection, McpServerGone, McpStartError
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
    """

    name = "mcp"

    def __init__(self, server: str | list[str] | dict[str, Any], tools: list[str] | None = None,
                 exclude: list[str] | None = None, prefix: str = "", timeout: float = 30.0,
                 startup_timeout: float = 60.0, max_output_chars: int = 20_000):
        if max_output_chars < 100:
            raise ValueError(f"max_output_chars must be >= 100, got {max_output_chars}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if not startup_timeout > 0:
            raise ValueError(f"startup_timeout must be > 0 seconds, got {startup_timeout}")
        if prefix and not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", prefix):
            raise ValueError(f"prefix must be letters, digits, '_' or '-' (at most 32), got {prefix!r}")
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

    async def close(self) -> None:
        """Stop the server once its last user closes (the set itself or one of its tools). Safe twice."""
        self._users = max(0, self._users - 1)
        if self._users == 0 and self.connection is not None:
            await self.connection.close()

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

    async def call_remote(self, remote_name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call the server's tool ``remote_name``; a failed result (never an exception) when it is gone."""
        connection = self.connection
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
        result = await self.owner.call_remote(self.remote_name, arguments)
        result.metadata.setdefault("mcp_tool", self.remote_name)
        return result


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
