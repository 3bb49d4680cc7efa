"""SCAFFOLD_EXTRA_PLUGINS: plugins without an entry point (inherited by worker processes)."""

from __future__ import annotations

from scaffold_core.plugins import PluginSet, extra_plugin_specs


def test_extra_plugins_from_the_environment_register_and_a_broken_one_is_listed(monkeypatch):
    monkeypatch.setenv("SCAFFOLD_EXTRA_PLUGINS", " scaffold_testkit.plugin , no_such_module_xyz,")
    specs = extra_plugin_specs()
    assert list(specs) == ["scaffold_testkit.plugin", "no_such_module_xyz"]
    plugins = PluginSet().load(entry_points=False, extra=specs)
    assert {"list", "arithmetic", "flaky_list"} <= set(plugins.registry.names("task"))
    broken = plugins.infos["no_such_module_xyz"]
    assert broken.status == "error" and "No module named 'no_such_module_xyz'" in broken.error
    assert plugins.infos["scaffold_testkit.plugin"].status == "ok"


def test_module_attribute_specs():
    import scaffold_testkit.plugin  # noqa: F401  (makes it an attribute of scaffold_testkit)

    plugins = PluginSet().load(entry_points=False, extra={"x": "scaffold_testkit:plugin"})
    assert "arithmetic" in plugins.registry.names("task")
