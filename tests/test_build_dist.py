"""The release path: `make dist` builds reproducible wheels and sdists of the core and every plugin, each plugin
pins the core series it supports, and the README's install lines work in a fresh venv.

The README's commands run exactly as written, from the root of a clean clone of this checkout
(``release_checkout``): `make dist` once per session (its ``dist/`` is ``dist_dir``), then, in one shell, a
new venv made with `python -m venv`, activated, the `pip install` lines with the venv's own pip (the
dependencies come from the package index; our own packages from ``dist/`` only: none is on an index) and
`scaffold list-plugins`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from scaffold_testkit.freshenv import run_bounded

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "scripts" / "build_dist.py"
PLUGINS = sorted(p for p in (REPO / "plugins").glob("scaffold-*") if (p / "pyproject.toml").is_file())
LIBS = sorted(p for p in (REPO / "libs").glob("scaffold-*") if (p / "pyproject.toml").is_file())
INSTALL_MARKER = ("<!-- doc-test: run-by: tests/test_build_dist.py::"
                  "test_the_readme_install_lines_work_in_a_fresh_venv -->")


def tomllib():
    return pytest.importorskip("tomllib")


def build(outdir: Path, only: str = "") -> dict[str, str]:
    run_bounded([sys.executable, str(BUILD), "--outdir", str(outdir), *(["--only", only] if only else [])],
                timeout=900, cwd=REPO)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in outdir.iterdir() if p.suffix in (".whl", ".gz")}


def test_make_dist_runs_the_build_script():
    recipe = re.search(r"^dist:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), flags=re.M)
    assert recipe and "scripts/build_dist.py --outdir dist" in recipe.group(1)


def test_every_plugin_pins_the_core_series_it_supports():
    from packaging.requirements import Requirement

    import scaffold_core

    core = scaffold_core.__version__
    major, minor = (int(n) for n in core.split(".")[:2])
    next_series = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    for plugin in PLUGINS:
        meta = tomllib().loads((plugin / "pyproject.toml").read_text())["project"]
        deps = [Requirement(d) for d in meta["dependencies"]]
        core_req = [r for r in deps if r.name == "scaffold-core"]
        assert core_req, f"{plugin.name} does not depend on scaffold-core"
        spec = core_req[0].specifier
        assert spec.contains(core), f"{plugin.name}: {spec} excludes the core it ships with ({core})"
        assert not spec.contains(next_series) and any(s.operator == "<" for s in spec), (
            f"{plugin.name}: {spec} has no upper bound below {next_series}: a future core may break it")


def test_dist_holds_a_wheel_and_an_sdist_of_each_distribution(dist_dir):
    names = sorted(p.name for p in dist_dir.iterdir())
    for project in [REPO, *LIBS, *PLUGINS]:
        meta = tomllib().loads((project / "pyproject.toml").read_text())["project"]
        stem = f"{meta['name'].replace('-', '_')}-{meta['version']}"
        assert f"{stem}-py3-none-any.whl" in names and f"{stem}.tar.gz" in names, (stem, names)
    sums = (dist_dir / "SHA256SUMS").read_text()
    assert all(name in sums for name in names if name != "SHA256SUMS")
    with zipfile.ZipFile(next(dist_dir.glob("scaffold_core-*.whl"))) as wheel:
        files = wheel.namelist()
        metadata = wheel.read(next(n for n in files if n.endswith("METADATA"))).decode()
    assert not any("templates/" in n for n in files)  # `scaffold new-plugin`'s templates are the test kit's
    assert not any(n.startswith(("tests/", "docs/", "plugins/", "libs/")) for n in files)
    # the test kit and the remote-engine layer are distributions of their own, not in the core's wheel
    assert not any(n.startswith(("scaffold_core/testing/", "scaffold_core/remote/")) for n in files)
    assert "Requires-Dist: torch" in metadata and not re.search(r"^Requires-Dist: torch[^;]*$", metadata, re.M), (
        "torch must only come with the transformers extra")
    with zipfile.ZipFile(next(dist_dir.glob("scaffold_testkit-*.whl"))) as wheel:
        assert "scaffold_testkit/templates/task/component.py.tmpl" in wheel.namelist()  # package data is in
    with zipfile.ZipFile(next(dist_dir.glob("scaffold_gsm8k-*.whl"))) as wheel:
        metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: scaffold-core<0.2,>=0.1" in metadata


def test_two_builds_are_byte_identical(dist_dir, tmp_path):
    again = build(tmp_path / "again", only="scaffold-core,scaffold-gsm8k")
    first = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in dist_dir.iterdir() if p.name in again}
    assert len(again) == 4 and again == first


def readme_install_lines() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    at = text.index(INSTALL_MARKER)
    block = re.search(r"```bash\n(.*?)```", text[at:], flags=re.S)
    assert block, "the README's install block is missing"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.split("#")[0].strip()]


def test_make_dist_as_written_fills_dist_in_the_checkout(release_checkout):
    """The README's first line, `make dist`, run from a clean clone's root, leaves the files in its dist/ (a
    relative --outdir is the caller's directory, not the build's)."""
    assert readme_install_lines()[0] == "make dist"
    built = sorted(p.name for p in (release_checkout / "dist").iterdir())
    assert len([n for n in built if n.endswith(".whl")]) == len(PLUGINS) + len(LIBS) + 1, built
    sums = (release_checkout / "dist" / "SHA256SUMS").read_text().splitlines()
    assert sorted(line.split()[1] for line in sums) == [n for n in built if n != "SHA256SUMS"]


def _shell_env(home: Path) -> dict[str, str]:
    """The environment the README's lines run in: a home of their own (for ~/scaffold-env), a `python` on PATH,
    nothing of this test's venv; pip's download cache shared with the user's."""
    leaky = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX", "PYTHONSTARTUP", "PIP_REQUIRE_VIRTUALENV")
    env = {k: v for k, v in os.environ.items() if k not in leaky}
    env.setdefault("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.slow
def test_the_readme_install_lines_work_in_a_fresh_venv(release_checkout, tmp_path):
    """The README's lines after `make dist`, exactly as written, in one shell from the clean clone's root; then a
    one-episode run on the canned engine from that venv, and no torch anywhere."""
    lines = readme_install_lines()
    assert lines[0] == "make dist" and lines[1].startswith("python -m venv ")
    assert any(line.startswith("pip install --find-links dist ") for line in lines)
    home = tmp_path / "home"
    home.mkdir()
    env = _shell_env(home)
    script = "\n".join(["set -euo pipefail", *lines[1:]])
    done = run_bounded(["bash", "-c", script], cwd=release_checkout, env=env, timeout=1500, check=False)
    assert done.returncode == 0, f"the README's lines failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "gsm8k" in done.stdout and "scaffold-gsm8k" in done.stdout  # `scaffold list-plugins`'s table
    venv_bin = home / "scaffold-env" / "bin"

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return run_bounded([str(venv_bin / args[0]), *args[1:]], cwd=tmp_path, timeout=300, check=False,
                           env={**env, "VIRTUAL_ENV": str(home / "scaffold-env"),
                                "PATH": os.pathsep.join([str(venv_bin), env["PATH"]]), **extra})

    torch = run("python", "-c", "import importlib.util as u; print(u.find_spec('torch') is None)")
    assert torch.stdout.strip() == "True", "installing the core and a plugin pulled in torch"
    listed = json.loads(run("scaffold", "list-plugins", "--json").stdout)
    gsm8k = {p["name"]: p for p in listed}["gsm8k"]
    assert gsm8k["status"] == "ok" and gsm8k["distribution"] == "scaffold-gsm8k"
    assert gsm8k["components"]["task"] == ["gsm8k", "gsm8k_calculator", "multiturn_gsm8k"]
    where = run("python", "-c", "import scaffold_core, scaffold_gsm8k; print(scaffold_core.__file__, "
                "scaffold_gsm8k.__file__)").stdout
    assert str(REPO) not in where and str(release_checkout) not in where and str(home) in where  # from the wheels
    config = tmp_path / "one.yaml"
    config.write_text("task: {name: gsm8k, source: sample, limit: 1}\n"
                      "engine: {name: benchmark_canned, response: \"#### 33\"}\n")
    ran = run("scaffold", "run", str(config), "-o", str(tmp_path / "run"), "--no-progress", HF_HUB_OFFLINE="1",
              HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "hf"),
              SCAFFOLD_CACHE_DIR=str(tmp_path / "cache"))
    assert ran.returncode == 0, ran.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["episodes"] == 1 and metrics["completed"] == 1


def test_the_release_workflow_builds_with_the_same_script_and_publishes_only_on_a_tag():
    workflow = (REPO / ".github" / "workflows" / "release.yml").read_text()
    assert "scripts/build_dist.py" in workflow
    assert re.search(r"on:\s*\n\s*push:\s*\n\s*tags:", workflow), "the workflow must run on version tags only"
    assert "pypa/gh-action-pypi-publish" in workflow and "id-token: write" in workflow


def test_build_script_refuses_an_unknown_project(tmp_path):
    proc = subprocess.run([sys.executable, str(BUILD), "--outdir", str(tmp_path), "--only", "scaffold-nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown project(s) scaffold-nope" in proc.stderr


def test_a_missing_build_requirement_is_named_with_the_install_line_before_any_build(tmp_path, monkeypatch):
    import importlib.util

    import build

    spec = importlib.util.spec_from_file_location("build_dist_script", BUILD)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    def check_dependency(requirement):
        return iter([(requirement,)] if requirement.startswith("setuptools") else [])

    monkeypatch.setattr(build, "check_dependency", check_dependency)
    monkeypatch.setattr(script, "source_epoch", lambda: script.DEFAULT_EPOCH)
    monkeypatch.setattr(script.subprocess, "run", lambda *a, **k: pytest.fail("built despite a missing requirement"))
    with pytest.raises(SystemExit, match=r"needs setuptools>=77 .*pip install 'setuptools>=77'"):
        script.build(tmp_path / "dist", ["scaffold-gsm8k"])


@pytest.mark.parametrize("project", [REPO, *LIBS, *PLUGINS], ids=lambda p: p.name)
def test_package_metadata_gives_setuptools_nothing_to_deprecate(project):
    """``make setup`` builds every package: a license given as a TOML table makes setuptools print a
    deprecation block per package; an SPDX string (setuptools >= 77) does not."""
    import tomllib

    data = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    license_ = data["project"].get("license")
    assert license_ is None or isinstance(license_, str), f"{project.name}: project.license must be an SPDX string"
    assert not any(c.startswith("License ::") for c in data["project"].get("classifiers", []))
    floors = [r for r in data["build-system"]["requires"] if r.startswith("setuptools")]
    assert floors == ["setuptools>=77"]


def test_the_cores_editable_install_gives_setuptools_nothing_to_warn_about(tmp_path):
    """``make setup`` installs the core editable: setuptools builds the editable wheel with no warning (for a
    flat layout with no explicit root mapping it installs an import hook and prints a warning block), and the
    wheel puts the root on ``sys.path`` with one ``.pth`` line."""
    import zipfile

    code = ("import sys, warnings, setuptools.warnings\n"
            "warnings.simplefilter('error', setuptools.warnings.SetuptoolsWarning)\n"
            "from setuptools import build_meta\n"
            "print(build_meta.build_editable(sys.argv[1]))\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    with zipfile.ZipFile(tmp_path / done.stdout.strip().splitlines()[-1]) as wheel:
        pth = [n for n in wheel.namelist() if n.endswith(".pth")]
        assert len(pth) == 1 and wheel.read(pth[0]).decode().strip() == str(REPO)
        assert not any(n.endswith("_finder.py") for n in wheel.namelist())  # no import hook
