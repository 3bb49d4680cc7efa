"""Root conftest: the whole suite (core and every plugin) runs under the leak guard."""

pytest_plugins = ["scaffold_core.testing.leakguard"]
