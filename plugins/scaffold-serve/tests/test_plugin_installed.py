"""The plugin as installed: listed, its controller registered, and light: neither importing it nor
`scaffold list-plugins` loads the server stack or the OpenAI client."""

from __future__ import annotations

from scaffold_testkit.installed import listed_plugin, modules_loaded

HEAVY = ["starlette", "uvicorn", "openai", "fastapi", "httpx", "torch", "agents", "langchain_openai"]


def test_listed_by_scaffold_list_plugins():
    plugin = listed_plugin("serve")
    assert plugin["status"] == "ok" and plugin["distribution"] == "scaffold-serve"
    assert plugin["components"]["controller"] == ["openai_agent"]


def test_importing_the_plugin_loads_nothing_heavy():
    assert modules_loaded(["scaffold_serve"], HEAVY) == []
    assert modules_loaded(["scaffold_core.cli.main"], HEAVY) == []


def test_list_plugins_stays_light():
    import subprocess
    import sys

    code = ("import sys, runpy; sys.argv = ['scaffold', 'list-plugins']\n"
            "try:\n    runpy.run_module('scaffold_core.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            f"print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "LOADED []"
