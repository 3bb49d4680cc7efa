"""Shared fixtures of the core's tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE_PLUGINS = Path(__file__).parent / "fixtures" / "plugins"
#: The fixture plugins' own tests are run by tests/test_kit_catches_broken_plugins.py (several are meant to
#: fail), never collected as part of this suite.
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture(scope="session")
def fixture_site(tmp_path_factory) -> Path:
    """The fixture plugin distributions, pip-installed (for real: dist-info, entry points) into a temp dir."""
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    packages = sorted(str(p) for p in FIXTURE_PLUGINS.iterdir() if (p / "pyproject.toml").exists())
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), *packages],
        check=True, timeout=300, cwd=build, capture_output=True,
    )
    return target


@pytest.fixture(scope="session")
def release_checkout(tmp_path_factory) -> Path:
    """A clean clone of this checkout (with its uncommitted changes) where `make dist` has run exactly as the
    README writes it, from the clone's root: its ``dist/`` holds the wheels and sdists of every distribution.

    The clone's ``.venv`` is this checkout's (so `make setup` has nothing to do), and only when it is set up for
    these very sources; otherwise the release tests are skipped (run `make setup`)."""
    from scaffold_testkit.freshenv import run_bounded

    repo = Path(__file__).resolve().parents[1]
    clone = tmp_path_factory.mktemp("release") / "scaffold"
    run_bounded(["git", "clone", "--quiet", str(repo), str(clone)], timeout=300)
    changed = run_bounded(["git", "ls-files", "-z", "--modified", "--others", "--exclude-standard"], cwd=repo,
                          timeout=120).stdout.split("\0")
    deleted = set(run_bounded(["git", "ls-files", "-z", "--deleted"], cwd=repo, timeout=120).stdout.split("\0"))
    for name in filter(None, changed):
        target = clone / name
        if name in deleted:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, target)
    if not (repo / ".venv" / "bin" / "python").exists():
        pytest.skip("the release tests need this checkout's .venv (run `make setup`)")
    (clone / ".venv").symlink_to(repo / ".venv")
    planned = run_bounded(["make", "-n", "setup"], cwd=clone, timeout=120).stdout
    if "pip install" in planned:
        pytest.skip("this checkout's .venv is not set up for these sources (run `make setup`)")
    run_bounded(["bash", "-e", "-c", "make dist"], cwd=clone, timeout=900)
    return clone


@pytest.fixture(scope="session")
def dist_dir(release_checkout) -> Path:
    """Wheels and sdists of scaffold-core and every plugin: what `make dist` left in a clean clone's dist/."""
    return release_checkout / "dist"


@pytest.fixture
def uv_pip_install():
    """``uv_pip_install(venv, args, cwd=...)``: see :func:`_uv_pip_install`."""
    return _uv_pip_install


def _uv_pip_install(venv, args: list[str], *, cwd: Path, timeout: float = 900) -> None:
    """``uv pip install ARGS`` into ``venv`` (pip's arguments), offline from uv's cache when it holds every
    dependency, else from the package index."""
    from scaffold_testkit.freshenv import find_uv

    uv = find_uv()
    if uv is None:
        pytest.skip("needs uv (the test extra) to install into a fresh venv")
    command = [uv, "pip", "install", *args, "--python", str(venv.python)]
    if venv.run(command, cwd=cwd, timeout=timeout, check=False, UV_OFFLINE="1").returncode != 0:
        venv.run(command, cwd=cwd, timeout=timeout)


def scaffold_cli(*args: str, site: Path | None = None, disable: str = "", env: dict | None = None,
                 cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the ``scaffold`` CLI in a subprocess, with ``site`` on its path (real entry points)."""
    full_env = dict(os.environ)
    if site is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(site), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env["SCAFFOLD_DISABLE_PLUGINS"] = disable
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "scaffold_core.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)


def listing(site: Path | None = None, disable: str = "", *extra: str) -> dict[str, dict]:
    proc = scaffold_cli("list-plugins", "--json", *extra, site=site, disable=disable)
    assert proc.returncode == 0, proc.stderr
    return {p["name"]: p for p in json.loads(proc.stdout)}


@pytest.fixture
def cli():
    """``cli(*args, site=..., disable=...)`` runs the scaffold CLI in a subprocess."""
    return scaffold_cli


@pytest.fixture
def list_plugins():
    """``list_plugins(site, disable, *extra)`` -> name -> plugin JSON object."""
    return listing


@pytest.fixture
def no_ipv6_sockets(monkeypatch):
    """A host view with IPv6 disabled: creating an AF_INET6 socket fails as on such hosts."""
    import errno
    import socket

    real = socket.socket

    def fake(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", fake)
