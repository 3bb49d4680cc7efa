"""Shared fixtures of scaffold-trl's training tests: the test plugin, in process and in subprocesses. (The tiny
policy they train, a one-layer Llama with SmolLM2's tokenizer, is the test kit's ``tiny_policy`` fixture.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


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
