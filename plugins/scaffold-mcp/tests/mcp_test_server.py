"""An MCP server written with the SDK's server API (MCPServer, the SDK 2 name of FastMCP), for the tests.

    python mcp_test_server.py              serves over stdio
    python mcp_test_server.py http PORT    serves streamable HTTP on 127.0.0.1:PORT/mcp
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("scaffold-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers and return their sum."""
    return a + b


@server.tool(name="text.upper")
def upper(text: str) -> str:
    """Return the text in capital letters."""
    return text.upper()


@server.tool()
def whoami() -> int:
    """The server process's id."""
    return os.getpid()


@server.tool()
def where() -> str:
    """The interpreter's environment (sys.prefix) the server runs in."""
    return sys.prefix


@server.tool()
async def wait(seconds: float) -> str:
    """Wait for some seconds, then say so."""
    await asyncio.sleep(seconds)
    return f"waited {seconds} s"


@server.tool()
def refuse(reason: str) -> str:
    """Always fails with the given reason."""
    raise ValueError(reason)


@server.tool()
def crash() -> str:
    """Exit the server process at once (a server that dies mid-run)."""
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
