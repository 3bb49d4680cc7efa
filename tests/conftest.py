"""Shared fixtures of the core's tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scaffold_core.plugins.markers import hookimpl

FIXTURE_PLUGINS = Path(__file__).parent / "fixtures" / "plugins"
#: The fixture plugins' own tests are run by tests/test_kit_catches_broken_plugins.py (several are meant to
#: fail), never collected as part of this suite.
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture
def test_plugins(monkeypatch):
    """This process, and any worker or CLI process it starts, sees the test tasks (``arithmetic``, ``list``,
    ...) through SCAFFOLD_EXTRA_PLUGINS; the process-wide plugin manager is rebuilt and restored after."""
    from scaffold_core.plugins import set_plugins

    monkeypatch.setenv("SCAFFOLD_EXTRA_PLUGINS", "scaffold_testkit.plugin")
    previous = set_plugins(None)
    yield
    set_plugins(previous)


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


# -- runs with answers that differ by seed: for `scaffold eval` and `scaffold report` ------------------------

#: Text a model could write that must stay text in a report (it would end a script or open a tag).
HOSTILE = "</script><script>window.hacked=1</script><img src=x onerror=alert(1)>{{JS}}"


def dice_respond(prompt: str, request) -> str:
    """A scripted model: problem i is answered right with probability (i % 5) / 4, by the request's seed;
    some answers ramble past max_tokens, some carry HTML that must stay text."""
    import random
    import re

    found = re.search(r"What is (\d+) \+ (\d+)", prompt)
    a, b = (int(x) for x in found.groups()) if found else (1, 1)
    rng = random.Random(request.seed)
    skill = (a % 5) / 4
    if rng.random() < 0.1:
        return "Let me think. " * 40  # stops on length (128 tokens)
    answer = a + b if rng.random() < skill else a + b + rng.choice([-10, -1, 1, 10])
    return f"{HOSTILE} {answer}" if rng.random() < 0.2 else str(answer)


class DicePlugin:
    """Task ``sums`` (``count`` additions; the first operand sets the difficulty; the second question carries
    :data:`HOSTILE`), engine ``dice`` and a verifier ``last_number`` (exact match on the last word)."""

    @hookimpl
    def register_tasks(self, registry):
        from scaffold_testkit import ListTask

        class Sums(ListTask):
            default_config = {"verifier": {"name": "last_number"}, "sampling": {"max_tokens": 128}}

            def __init__(self, count: int = 12):
                super().__init__([{"id": f"sum-{i:02d}", "question": f"What is {10 + i} + {20 + 3 * i}?"
                                   + (f" {HOSTILE}" if i == 1 else ""), "answer": str(30 + 4 * i)}
                                  for i in range(count)])

        registry.add("sums", Sums)

    @hookimpl
    def register_engines(self, registry):
        from scaffold_testkit.engines import ScriptedEngine

        registry.add("dice", lambda: ScriptedEngine(dice_respond))

    @hookimpl
    def register_verifiers(self, registry):
        from scaffold_core.verifier import Verdict, Verifier

        class LastNumber(Verifier):
            def verify(self, response, reference):
                words = response.split()
                last = words[-1] if words and words[-1].lstrip("-").isdigit() else None
                if last is None:
                    return Verdict(0.0, None, None, "no number at the end")
                return Verdict(float(last == str(reference)), last, last, "match" if last == str(reference) else "no")

        registry.add("last_number", LastNumber)


@pytest.fixture(scope="session")
def dice_plugins():
    """A plugin set with the built-ins and :class:`DicePlugin`."""
    from scaffold_testkit import plugin_set

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
def eval_dir(tmp_path_factory, dice_plugins, dice_config) -> Path:
    """A finished `scaffold eval` of 12 problems, 4 answers each (k = 1, 2, 4), its report not yet written."""
    from scaffold_core.eval.command import run_eval

    out = tmp_path_factory.mktemp("eval") / "run"
    run_eval(dice_config(), [1, 2, 4], output_dir=out, plugins=dice_plugins, progress=False)
    return out
