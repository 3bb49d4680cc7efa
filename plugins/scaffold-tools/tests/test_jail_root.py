"""The jail root: only the Python runtime (no tests, site-packages, refused modules), built once and reused,
rebuilt when the runtime changes, and old roots pruned."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from scaffold_tools import jail_root
from scaffold_tools.jail_root import BOOT_PATH, build_jail_root, describe_runtime, prune

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the jail is Linux's")


@pytest.fixture(scope="module")
def runtime():
    return describe_runtime(sys.executable)


@pytest.fixture(scope="module")
def built(runtime, tmp_path_factory):
    cache = tmp_path_factory.mktemp("jail-cache")
    return build_jail_root(runtime, cache), cache


def test_it_holds_the_runtime_and_nothing_else(runtime, built):
    root, _ = built
    inside = Path(str(root.path) + runtime.executable)
    assert inside.is_file() and os.access(inside, os.X_OK)
    stdlib = Path(str(root.path) + next(p for p in runtime.paths if Path(p, "os.py").exists()))
    assert (stdlib / "os.py").is_file() and (stdlib / "json" / "__init__.py").is_file()
    for absent in ("test", "site-packages", "tkinter", "idlelib", "ctypes"):
        assert not (stdlib / absent).exists(), absent
    names = {p.name.split(".")[0] for p in stdlib.rglob("*.so")}
    assert "_json" in names or "_struct" in names or not names  # extension modules are there (when built so)
    assert not names & {"_ctypes", "_testcapi", "_xxsubinterpreters", "readline", "_tkinter"}
    assert Path(str(root.path) + BOOT_PATH).is_file()
    top = {name for name, _link in root.entries()}
    assert "home" not in top and "etc" not in top and "work" not in top


def test_an_unchanged_runtime_reuses_its_root(runtime, built, monkeypatch):
    root, cache = built
    monkeypatch.setattr(jail_root, "_libraries", lambda extensions: pytest.fail("rebuilt an unchanged root"))
    assert build_jail_root(runtime, cache).path == root.path


def test_a_changed_library_rebuilds_it(runtime, built, monkeypatch):
    """A library whose size or time no longer matches the manifest (an upgrade) gets the root rebuilt."""
    root, cache = built
    manifest = root.path / "manifest.json"
    recorded = json.loads(manifest.read_text())
    library = next(iter(recorded["libraries"]))
    stale = {**recorded, "libraries": {**recorded["libraries"], library: [0, 0]}}
    manifest.write_text(json.dumps(stale))
    calls = []
    real = jail_root._libraries
    monkeypatch.setattr(jail_root, "_libraries", lambda extensions: calls.append(1) or real(extensions))
    rebuilt = build_jail_root(runtime, cache)
    assert calls == [1] and rebuilt.path == root.path
    assert json.loads(manifest.read_text()) == recorded


def test_unreachable_site_packages_are_copied_in_and_reachable_ones_bound(runtime, tmp_path):
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("X = 1\n")
    with_site = describe_runtime(sys.executable, [str(site)])
    jailed_as_other = build_jail_root(with_site, tmp_path / "cache", jail_uid=65534)
    if jail_root.reachable_by_others(site, readable=True):
        assert jailed_as_other.bound_site_packages == (str(site.resolve()),)
    else:
        assert jailed_as_other.bound_site_packages == ()
        assert Path(str(jailed_as_other.path) + str(site.resolve()) + "/pkg/__init__.py").read_text() == "X = 1\n"
    as_me = build_jail_root(with_site, tmp_path / "cache")
    assert as_me.bound_site_packages == (str(site.resolve()),)


def test_prune_keeps_recent_roots_and_removes_old_ones(tmp_path):
    cache = tmp_path / "cache"
    for i in range(5):
        (cache / f"root{i}").mkdir(parents=True)
        (cache / f"root{i}" / "manifest.json").write_text("{}")
        old = time.time() - 86400 * (i + 1)
        os.utime(cache / f"root{i}" / "manifest.json", (old, old))
    (cache / "not-a-root").mkdir()
    prune(cache, keep=cache / "root4", limit=3)
    assert sorted(p.name for p in cache.iterdir()) == ["not-a-root", "root0", "root1", "root4"]
