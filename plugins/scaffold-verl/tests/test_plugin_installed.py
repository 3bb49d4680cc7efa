"""The plugin is installed, light to load, and registers with verl under its real import paths."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys

import fake_verl
import pytest
from scaffold_testkit.installed import fake_modules, listed_plugin, modules_loaded
from scaffold_testkit.replies import answers
from verl_helpers import EOS, MESSAGES, PROMPT_LENGTH, RESPONSE_LENGTH, SAMPLING, TOKENIZER

from scaffold_core.errors import MissingDependencyError


def test_listed_by_scaffold_list_plugins():
    entry = listed_plugin("verl")
    assert entry["status"] == "ok" and entry["distribution"] == "scaffold-verl", entry


def test_loading_the_plugin_imports_neither_verl_nor_torch():
    assert modules_loaded(["scaffold_verl", "scaffold_verl.loop"], ["verl", "torch", "transformers"]) == []


def test_without_verl_the_agent_loop_says_how_to_install_it():
    if importlib.util.find_spec("verl") is not None:
        pytest.skip("verl is installed")
    sys.modules.pop("scaffold_verl.agent_loop", None)
    with pytest.raises(MissingDependencyError, match=r'pip install "scaffold-verl\[verl\]"'):
        importlib.import_module("scaffold_verl.agent_loop")


@pytest.fixture
def verl_modules(monkeypatch):
    """The fake's classes installed under verl's module path, and a fresh scaffold_verl.agent_loop."""
    fake_modules(monkeypatch, {"verl.experimental.agent_loop.agent_loop": {
        attr: getattr(fake_verl, attr) for attr in ("AgentLoopBase", "AgentLoopOutput", "register",
                                                    "_agent_loop_registry")}})
    monkeypatch.delitem(sys.modules, "scaffold_verl.agent_loop", raising=False)
    yield
    sys.modules.pop("scaffold_verl.agent_loop", None)
    fake_verl._agent_loop_registry.pop("scaffold_agent", None)


def test_verl_finds_the_loop_by_name_and_builds_it_from_its_yaml_entry(verl_modules):
    """Importing registers ``scaffold_agent``; a YAML entry (nested configs, as hydra passes them) builds it."""
    importlib.import_module("scaffold_verl.agent_loop")
    target = "scaffold_verl.agent_loop.ScaffoldAgentLoop"
    assert fake_verl._agent_loop_registry["scaffold_agent"] == {"_target_": target}
    entry = fake_verl.Config(_target_=target, name="scaffold_agent",
                             controller=fake_verl.Config(name="best_of_n", samples=2), verifier="gsm8k")
    srv = fake_verl.FakeServerManager(answers("#### 41", "#### 42"), eos_token_id=EOS, prompt_length=PROMPT_LENGTH,
                                      response_length=RESPONSE_LENGTH)
    config = fake_verl.trainer_config(PROMPT_LENGTH, RESPONSE_LENGTH)

    async def main():
        from scaffold_verl.loop import close_shared

        try:
            loop = fake_verl.instantiate(fake_verl.fake_classes(), entry, server=srv, tokenizer=TOKENIZER,
                                         config=config)
            assert isinstance(loop, fake_verl.AgentLoopBase)
            return await loop.run(dict(SAMPLING), raw_prompt=list(MESSAGES), reward_model={"ground_truth": "42"})
        finally:
            await close_shared()

    out = asyncio.run(main())
    assert out.reward_score == 1.0 and TOKENIZER.decode(out.response_ids, skip_special_tokens=True) == "#### 42"
