"""The plugin is installed, light to load, and selects AReaL's real classes by their import paths."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import subprocess
import sys
import types

import fake_areal
import pytest
from areal_helpers import TOKENIZER, answers, engine

from scaffold_core.errors import MissingDependencyError


def test_listed_by_scaffold_list_plugins():
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "list-plugins", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    plugins = {p["name"]: p for p in json.loads(out)}
    assert plugins["areal"]["status"] == "ok", plugins["areal"]
    assert plugins["areal"]["distribution"] == "scaffold-areal"


def test_loading_the_plugin_imports_neither_areal_nor_torch():
    code = ("import sys, scaffold_areal, scaffold_areal.rollout\n"
            "print(sorted(m for m in ('areal', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_without_areal_the_workflow_says_how_to_install_it():
    if importlib.util.find_spec("areal") is not None:
        pytest.skip("AReaL is installed")
    sys.modules.pop("scaffold_areal.workflow", None)
    with pytest.raises(MissingDependencyError, match=r'pip install "scaffold-areal\[areal\]"'):
        importlib.import_module("scaffold_areal.workflow")


@pytest.fixture
def areal_modules(monkeypatch):
    """The fake's classes installed under AReaL's module paths, and a fresh scaffold_areal.workflow."""
    modules = {"areal": None, "areal.api": None, "areal.api.cli_args": "GenerationHyperparameters",
               "areal.api.io_struct": "ModelRequest", "areal.api.workflow_api": "RolloutWorkflow"}
    for name, attr in modules.items():
        module = types.ModuleType(name)
        if attr:
            setattr(module, attr, getattr(fake_areal, attr))
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "scaffold_areal.workflow", raising=False)
    yield
    sys.modules.pop("scaffold_areal.workflow", None)


def test_areal_resolves_the_workflow_by_its_import_path(areal_modules):
    """What AReaL's _resolve_workflow does with a dotted path: import, getattr, cls(**workflow_kwargs)."""
    module_name, _, cls_name = "scaffold_areal.workflow.ScaffoldWorkflow".rpartition(".")
    cls = getattr(importlib.import_module(module_name), cls_name)
    assert issubclass(cls, fake_areal.RolloutWorkflow)
    wf = cls(**dict(verifier="gsm8k", gconfig=fake_areal.GenerationHyperparameters(max_new_tokens=32),
                    tokenizer=TOKENIZER))
    eng = engine(types.SimpleNamespace(classes=fake_areal.fake_classes()), answers("#### 42"))

    async def main():
        try:
            return await wf.arun_episode(eng, {"messages": [{"role": "user", "content": "40 + 2?"}], "answer": "42"})
        finally:
            await wf.aclose()

    out = asyncio.run(main())
    assert out["rewards"].tolist() == [1.0]
    assert isinstance(eng.requests[0], fake_areal.ModelRequest)
