"""The installed plugin: listed with its components, and light to load (heavy libraries only when used)."""

from __future__ import annotations

from scaffold_testkit.installed import listed_plugin, modules_loaded

MODULES = ["scaffold_methods", "scaffold_methods.deepconf", "scaffold_methods.dynasor", "scaffold_methods.rerank",
           "scaffold_methods.tree_search", "scaffold_methods.judge", "scaffold_methods.reward_model",
           "scaffold_methods.arithmetic", "scaffold_methods.backends"]


def test_listed_with_its_components():
    plugin = listed_plugin("methods")
    assert plugin["status"] == "ok" and plugin["distribution"] == "scaffold-methods"
    components = plugin["components"]
    assert components["controller"] == ["deepconf", "dynasor", "rerank", "tree_search"]
    assert components["verifier"] == ["judge", "reward_model", "small_arithmetic"]
    assert components["task"] == ["small_arithmetic"]


def test_importing_every_module_loads_no_heavy_library():
    assert modules_loaded(MODULES, ["torch", "transformers", "httpx", "numpy"]) == []
