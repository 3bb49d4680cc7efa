"""The plugin as a user sees it: listed by `scaffold list-plugins`, and light to load."""

from __future__ import annotations

import json
import subprocess
import sys

from scaffold_testkit.installed import listed_plugin


def test_listed_by_scaffold_list_plugins_with_its_components():
    plugin = listed_plugin("verifiers")
    assert plugin["status"] == "ok", plugin
    assert plugin["distribution"] == "scaffold-verifiers"
    assert plugin["components"]["task"] == ["verifiers"]
    assert plugin["components"]["verifier"] == ["verifiers"]
    assert plugin["components"]["controller"] == ["verifiers_rollout"]


def test_registering_imports_neither_its_library_nor_heavy_ones():
    """`scaffold list-plugins` stays fast: registering the components imports verifiers (and torch, transformers)
    only when they are used."""
    code = ("import json, sys, scaffold_verifiers\n"
            "from scaffold_testkit import plugin_set\n"
            "plugin_set(under_test=scaffold_verifiers)\n"
            "print(json.dumps(sorted(m for m in ('verifiers', 'torch', 'transformers') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], out.stdout
