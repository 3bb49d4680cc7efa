import json
import subprocess
import sys

import pytest

from scaffold_core.plugins import KINDS


def listing() -> dict[str, dict]:
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "list-plugins", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return {p["name"]: p for p in json.loads(out)}


def test_listed_by_scaffold_list_plugins():
    plugins = listing()
    assert plugins["tools"]["status"] == "ok", plugins["tools"]
    assert plugins["tools"]["distribution"] == "scaffold-tools"
    assert "register_tools" in plugins["tools"]["hooks"]


@pytest.mark.skipif("tool" not in KINDS, reason="this core has no `tool` component kind yet")
def test_registers_its_tools():
    assert listing()["tools"]["components"]["tool"] == ["calculator", "python", "search"]


def test_register_tools_adds_each_tool_with_a_typed_factory():
    import inspect

    import scaffold_tools
    from scaffold_core.tool import check_tool

    added = {}

    class Registry:
        def add(self, name, factory, *, description=None):
            added[name] = factory

    scaffold_tools.register_tools(Registry())
    assert sorted(added) == ["calculator", "python", "search"]
    for name, factory in added.items():
        tool = factory()
        check_tool(tool)
        assert tool.name == name
        params = inspect.signature(factory).parameters.values()
        assert all(p.annotation is not p.empty and p.default is not p.empty for p in params), name
