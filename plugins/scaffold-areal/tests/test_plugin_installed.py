"""The plugin is installed, light to load, and selects AReaL's real classes by their import paths."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
import types

import fake_areal
import pytest
from areal_helpers import TOKENIZER, engine
from scaffold_testkit.installed import fake_modules, listed_plugin, modules_loaded
from scaffold_testkit.replies import answers

from scaffold_core.errors import MissingDependencyError


def test_listed_by_scaffold_list_plugins():
    entry = listed_plugin("areal")
    assert entry["status"] == "ok" and entry["distribution"] == "scaffold-areal", entry


def test_loading_the_plugin_imports_neither_areal_nor_torch():
    assert modules_loaded(["scaffold_areal", "scaffold_areal.rollout"], ["areal", "torch", "transformers"]) == []


def test_without_areal_the_workflow_says_how_to_install_it():
    if importlib.util.find_spec("areal") is not None:
        pytest.skip("AReaL is installed")
    sys.modules.pop("scaffold_areal.workflow", None)
    with pytest.raises(MissingDependencyError, match=r'pip install "scaffold-areal\[areal\]"'):
        importlib.import_module("scaffold_areal.workflow")


@pytest.fixture
def areal_modules(monkeypatch):
    """The fake's classes installed under AReaL's module paths, and a fresh scaffold_areal.workflow."""
    fake_modules(monkeypatch, {
        "areal.api.cli_args": {"GenerationHyperparameters": fake_areal.GenerationHyperparameters},
        "areal.api.io_struct": {"ModelRequest": fake_areal.ModelRequest},
        "areal.api.workflow_api": {"RolloutWorkflow": fake_areal.RolloutWorkflow}})
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
