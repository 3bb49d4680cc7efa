"""Root conftest: the whole suite (core and every plugin) runs under the leak guard.

`make test` runs the suite on two pytest-xdist workers (``--dist loadgroup``). A test file's tests run on
one worker, in order (its module fixtures are built once), and so do all the tests that share an expensive
session fixture, wherever they are, so that it is built once: the release checkout where `make dist` ran,
and the bundled SmolLM2 engine.
"""

import pytest

pytest_plugins = ["scaffold_core.testing.leakguard"]

#: session fixture -> the xdist group of every test that uses it (the first match wins)
SHARED_FIXTURE_GROUPS = {"release_checkout": "release", "dist_dir": "release", "smollm2_engine": "smollm2"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        names = getattr(item, "fixturenames", ())
        group = next((g for f, g in SHARED_FIXTURE_GROUPS.items() if f in names), item.nodeid.split("::")[0])
        item.add_marker(pytest.mark.xdist_group(group))
