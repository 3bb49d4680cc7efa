"""scaffold-mcp: the tools of a Model Context Protocol server as scaffold tools.

Components (hookimpls only; the logic lives in sibling modules):

* tool ``mcp`` (:class:`scaffold_mcp.toolset.McpToolSet`): a tool set whose tools are the server's,
  listed when the run starts; the server (a stdio command, or an HTTP server started with the run, or
  a URL) is connected through the official ``mcp`` SDK and always stopped at the end of the run.
"""

from __future__ import annotations

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_tools(registry):
    from .toolset import McpToolSet

    registry.add("mcp", McpToolSet)


@hookimpl
def plugin_notes():
    from .connection import sdk_problem

    problem = sdk_problem(import_it=False)
    return [f"mcp tool: cannot run: {problem}"] if problem else []
