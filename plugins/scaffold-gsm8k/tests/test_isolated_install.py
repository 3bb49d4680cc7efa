"""`pip install scaffold-gsm8k` is all a user needs: checked in a fresh venv holding only scaffold-core.

The venv gets the core without its ``transformers`` extra (so no torch), then
the plugin. Before the plugin, a config naming ``gsm8k`` fails with the install
hint; after it, ``gsm8k`` is listed and a run uses it by name (on the
dependency-free canned engine). Light dependencies come from PyPI, through
``uv`` when it is available (much faster) and pip otherwise. Sources are
copied to a temp folder first, so building them leaves nothing in the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT = 600
COMMAND_TIMEOUT = 120

pytestmark = pytest.mark.slow


def _uv() -> str | None:
    return shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))


def _run(args: list[str], *, timeout: float, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def _copy_sources(dest: Path) -> tuple[Path, Path]:
    skip = ("__pycache__", "*.egg-info", "build", "dist", ".pytest_cache")
    core = dest / "core"
    core.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, core / name)
    shutil.copytree(ROOT / "scaffold_core", core / "scaffold_core", ignore=shutil.ignore_patterns(*skip))
    plugin = dest / "scaffold-gsm8k"
    shutil.copytree(PLUGIN, plugin, ignore=shutil.ignore_patterns(*skip, "tests"))
    return core, plugin


@pytest.fixture
def fresh_env(tmp_path):
    # A clean environment, except the test-session marker (the leak guard finds stray processes by it).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "SCAFFOLD_")) or k == "SCAFFOLD_TEST_SESSION"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"),
               SCAFFOLD_CACHE_DIR=str(tmp_path / "scaffold-cache"))
    venv = tmp_path / "venv"
    uv = _uv()
    if uv:
        made = _run([uv, "venv", "-q", "--python", sys.executable, venv], timeout=COMMAND_TIMEOUT, env=env,
                    cwd=tmp_path)
    else:
        made = _run([sys.executable, "-m", "venv", venv], timeout=COMMAND_TIMEOUT, env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"

    def install(path: Path) -> None:
        if uv:
            cmd = [uv, "pip", "install", "-q", "--python", python, path]
        else:
            cmd = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", path]
        done = _run(cmd, timeout=INSTALL_TIMEOUT, env=env, cwd=tmp_path)
        assert done.returncode == 0, f"installing {path.name} failed:\n{done.stdout}\n{done.stderr}"

    yield python, install, env
    shutil.rmtree(venv, ignore_errors=True)


def test_plugin_installs_into_a_core_only_environment(fresh_env, tmp_path):
    python, install, env = fresh_env
    core, plugin = _copy_sources(tmp_path / "src")
    scaffold = python.parent / "scaffold"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return _run([scaffold, *args], timeout=COMMAND_TIMEOUT, env=env, cwd=tmp_path)

    config = tmp_path / "gsm8k.yaml"
    config.write_text("task: {name: gsm8k, source: sample, limit: 2}\n"
                      "engine: {name: benchmark_canned, response: \"#### 33\"}\n"
                      "rollout: {progress: false}\n")

    install(core)
    no_torch = _run([python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"],
                    timeout=COMMAND_TIMEOUT, env=env, cwd=tmp_path)
    assert no_torch.returncode == 0, "the core alone must not pull in torch"
    listed = cli("list-plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "gsm8k" not in {p["name"] for p in json.loads(listed.stdout)}
    missing = cli("config", str(config))
    assert missing.returncode == 1
    assert "unknown task 'gsm8k'" in missing.stderr and "pip install scaffold-gsm8k" in missing.stderr

    install(plugin)
    listed = cli("list-plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)}
    assert plugins["gsm8k"]["status"] == "ok" and plugins["gsm8k"]["distribution"] == "scaffold-gsm8k"
    assert plugins["gsm8k"]["components"]["task"] == ["gsm8k"]
    assert plugins["gsm8k"]["components"]["verifier"] == ["gsm8k"]  # math_verify needs the extra

    ran = cli("run", str(config), "-o", str(tmp_path / "run"))
    assert ran.returncode == 0, ran.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["completed"], metrics["reward_mean"]) == (2, 0.5)  # "#### 33" answers the first problem

    math_verify = cli("config", str(config), "--set", "verifier.name=math_verify")
    assert math_verify.returncode == 1 and 'pip install "scaffold-gsm8k[math-verify]"' in math_verify.stderr
