"""Installing scaffold-gsm8k is all a user needs: checked in a fresh venv holding only scaffold-core.

The venv gets the core without its ``transformers`` extra (so no torch), then
the plugin. Before the plugin, a config naming ``gsm8k`` fails with the install
hint; after it, ``gsm8k`` is listed and a run uses it by name (on the
dependency-free canned engine). The venv comes from the core's test kit
(:class:`scaffold_testkit.freshenv.FreshVenv`: uv when available, sources
copied out first so building them leaves nothing in the checkout).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from scaffold_testkit.freshenv import FreshVenv

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT = 600
COMMAND_TIMEOUT = 120

pytestmark = pytest.mark.slow


@pytest.fixture
def venv(tmp_path):
    with FreshVenv.create(timeout=COMMAND_TIMEOUT) as env:
        yield env


def test_plugin_installs_into_a_core_only_environment(venv, tmp_path):
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets"),
               "SCAFFOLD_CACHE_DIR": str(tmp_path / "scaffold-cache")}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return venv.run(["scaffold", *args], timeout=COMMAND_TIMEOUT, cwd=tmp_path, check=False, **offline)

    config = tmp_path / "gsm8k.yaml"
    config.write_text("task: {name: gsm8k, source: sample, limit: 2}\n"
                      "engine: {name: benchmark_canned, response: \"#### 33\"}\n"
                      "rollout: {progress: false}\n")

    venv.install_project(ROOT, timeout=INSTALL_TIMEOUT)
    no_torch = venv.run(["python", "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"],
                        timeout=COMMAND_TIMEOUT, check=False)
    assert no_torch.returncode == 0, "the core alone must not pull in torch"
    listed = cli("list-plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "gsm8k" not in {p["name"] for p in json.loads(listed.stdout)}
    missing = cli("config", str(config))
    assert missing.returncode == 1
    assert "unknown task 'gsm8k'" in missing.stderr
    assert "docs/plugins.md lists which package adds which component" in missing.stderr

    venv.install_project(PLUGIN, timeout=INSTALL_TIMEOUT)
    listed = cli("list-plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)}
    assert plugins["gsm8k"]["status"] == "ok" and plugins["gsm8k"]["distribution"] == "scaffold-gsm8k"
    assert plugins["gsm8k"]["components"]["task"] == ["gsm8k", "gsm8k_calculator", "multiturn_gsm8k"]
    assert plugins["gsm8k"]["components"]["verifier"] == ["gsm8k"]  # math_verify needs the extra

    ran = cli("run", str(config), "-o", str(tmp_path / "run"))
    assert ran.returncode == 0, ran.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["completed"], metrics["reward_mean"]) == (2, 0.5)  # "#### 33" answers the first problem

    math_verify = cli("config", str(config), "--set", "verifier.name=math_verify")
    assert math_verify.returncode == 1
    # the core names no plugin: the error points to the table of which package adds which component
    assert "unknown verifier 'math_verify'" in math_verify.stderr
    assert "docs/plugins.md lists which package adds which component" in math_verify.stderr
