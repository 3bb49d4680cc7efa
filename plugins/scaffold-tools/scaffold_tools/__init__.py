"""scaffold-tools: built-in tools for tool-calling agents.

Components (hookimpls only; the logic lives in sibling modules):

* tool ``calculator`` (:class:`scaffold_tools.calculator.CalculatorTool`): arithmetic by parsing, never eval
* tool ``python`` (:class:`scaffold_tools.python_tool.PythonTool`): a program in a limited child process
* tool ``search`` (:class:`scaffold_tools.search.SearchTool`): BM25 over a local JSONL collection

Public API for other plugins: :func:`run_untrusted` (a model's program in the python tool's jail, for rubrics
and environments that execute model-written code; :mod:`scaffold_tools.untrusted`).
"""

from __future__ import annotations

from scaffold_core import hookimpl
from scaffold_core.plugins import lazy_exports

__version__ = "0.1.0"
__all__ = ["UntrustedResult", "run_untrusted"]


# ``run_untrusted`` and ``UntrustedResult``, imported on first use (``list-plugins`` loads this module).
__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "untrusted"))


@hookimpl
def register_tools(registry):
    from .calculator import CalculatorTool
    from .python_tool import PythonTool
    from .search import SearchTool

    registry.add("calculator", CalculatorTool)
    registry.add("python", PythonTool)
    registry.add("search", SearchTool)


@hookimpl
def plugin_notes():
    from .python_tool import jail_summary

    return [f"python tool: {jail_summary()}"]
