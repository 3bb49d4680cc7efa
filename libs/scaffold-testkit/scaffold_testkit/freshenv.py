"""A fresh virtual environment for install tests: does a package install, list and run on its own?

:class:`FreshVenv` creates a venv in a temporary folder (with ``uv`` when it is
installed, which caches and hard-links packages; else ``python -m venv`` and
pip), installs into it, and runs its commands with a bounded time and an
environment stripped of the caller's venv. Every command runs in its own
process group, killed whole on timeout. :meth:`FreshVenv.close` removes the
folder.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Variables that would make commands in the fresh venv see the caller's environment.
_LEAKY = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX", "PYTHONSTARTUP", "PYTEST_ADDOPTS",
          "PYTEST_PLUGINS")


#: What a project copy leaves out at any depth: build outputs, caches, environments, version control.
_NOT_SOURCE = ("build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv", ".git", ".pytest_cache",
               ".hypothesis")
#: Top-level folders of a project a non-editable install does not need (the default ``skip``).
SKIP_TOP = ("tests", "docs", "bench", "plugins", "libs", "runs", "examples")


def find_uv() -> str | None:
    """The ``uv`` executable, if the ``uv`` package or binary is installed."""
    if importlib.util.find_spec("uv") is not None:
        try:
            from uv import find_uv_bin

            return find_uv_bin()
        except Exception:
            pass
    return shutil.which("uv")


def run_bounded(args: Sequence[str], *, timeout: float, cwd: str | Path | None = None,
                env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``args`` (a list, never a shell string); kill its whole process group after ``timeout`` s."""
    proc = subprocess.Popen(list(map(str, args)), cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(map(str, args))} did not finish within {timeout:g} s\n"
                             f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}") from None
    except BaseException:
        _kill_group(proc)
        proc.communicate()
        raise
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"--- stdout ---\n{out[-6000:]}\n--- stderr ---\n{err[-6000:]}")
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


class FreshVenv:
    """A new virtual environment in its own temporary folder."""

    def __init__(self, root: Path, uv: str | None):
        self.root = root
        self.path = root / "venv"
        self.uv = uv
        bindir = "Scripts" if os.name == "nt" else "bin"
        self.bin = self.path / bindir
        self.python = self.bin / ("python.exe" if os.name == "nt" else "python")

    @classmethod
    def create(cls, *, timeout: float = 300.0, use_uv: bool = True) -> FreshVenv:
        """Create the venv (Python: the one running this code)."""
        root = Path(tempfile.mkdtemp(prefix="scaffold-freshenv-"))
        venv = cls(root, find_uv() if use_uv else None)
        try:
            if venv.uv:
                run_bounded([venv.uv, "venv", "--quiet", "--python", sys.executable, str(venv.path)], timeout=timeout,
                            env=venv.env())
            else:
                run_bounded([sys.executable, "-m", "venv", str(venv.path)], timeout=timeout, env=venv.env())
        except BaseException:
            venv.close()
            raise
        return venv

    def env(self, **extra: str) -> dict[str, str]:
        """The environment commands run in: this venv first on PATH, the caller's venv gone."""
        env = {k: v for k, v in os.environ.items() if k not in _LEAKY}
        env["PATH"] = os.pathsep.join([str(self.bin), env.get("PATH", "")])
        env["VIRTUAL_ENV"] = str(self.path)
        env["PYTHONNOUSERSITE"] = "1"
        env.setdefault("UV_NO_PROGRESS", "1")
        tmp = self.root / "tmp"  # uv and pip leave lock files in TMPDIR: keep them inside our folder
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
        env.update(extra)
        return env

    def install(self, *requirements: str | Path, timeout: float = 900.0) -> subprocess.CompletedProcess:
        """Install requirements (names or paths to project folders), non-editable, in one resolve."""
        reqs = [str(r) for r in requirements]
        if self.uv:
            args = [self.uv, "pip", "install", "--quiet", "--python", str(self.python), *reqs]
        else:
            args = [str(self.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *reqs]
        return run_bounded(args, timeout=timeout, env=self.env())

    def install_project(self, project: str | Path, *more: str | Path, skip: Sequence[str] = SKIP_TOP,
                        timeout: float = 900.0) -> Path:
        """Copy the project folder ``project`` out (so building it never writes into the source tree)
        and install the copy, non-editable, together with ``more`` requirements.

        The copy leaves out build outputs and caches, and the top-level folders in ``skip``.
        """
        source = Path(project).resolve()
        if not (source / "pyproject.toml").is_file():
            raise FileNotFoundError(f"{source} has no pyproject.toml: not a project folder")
        copy = self.root / "src" / source.name
        anywhere = shutil.ignore_patterns(*_NOT_SOURCE)

        def ignore(folder: str, names: list[str]) -> set[str]:
            ignored = set(anywhere(folder, names))
            if Path(folder).resolve() == source:
                ignored.update(n for n in names if n in skip)
            return ignored

        shutil.copytree(source, copy, ignore=ignore)
        self.install(copy, *more, timeout=timeout)
        return copy

    def run(self, args: Sequence[str | Path], *, timeout: float = 300.0, cwd: str | Path | None = None,
            check: bool = True, **env: str) -> subprocess.CompletedProcess:
        """Run a command of this venv (e.g. ``["scaffold", "list-plugins"]``) with bounded time."""
        argv = [str(a) for a in args]
        if not os.path.isabs(argv[0]) and (self.bin / argv[0]).exists():
            argv[0] = str(self.bin / argv[0])
        return run_bounded(argv, timeout=timeout, cwd=cwd, env=self.env(**env), check=check)

    def close(self) -> None:
        """Remove the venv and its folder."""
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> FreshVenv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
