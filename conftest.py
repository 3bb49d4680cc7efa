"""Root conftest: the whole suite (core and every plugin) runs under the leak guard.

`make test` runs the suite on two pytest-xdist workers. A test file's tests run on one worker, in order
(its module fixtures are built once), and so do all the files that use an expensive session fixture, so
that it is built once: the release checkout where `make dist` ran, the bundled SmolLM2 engine, and the
pip-installed fixture plugins.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

import pytest

pytest_plugins = ["scaffold_testkit.leakguard"]


def _share_the_cores() -> None:
    """Each xdist worker's torch (and the processes its tests start) gets its share of the cores: with more
    OpenMP threads than cores the waiting ones spin, and a model test took 2.5x the CPU time (measured)."""
    from scaffold_core.launch import default_threads

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(default_threads(workers))


_share_the_cores()

ROOT = Path(__file__).resolve().parent
#: session fixture -> the group of every test file that uses it (the first match wins)
SHARED_FIXTURE_GROUPS = {"release_checkout": "release", "dist_dir": "release", "smollm2_engine": "smollm2",
                         "fixture_site": "fixture-plugins"}


@cache
def file_group(path: str) -> str:
    """The worker group of a test file: the group of the first shared session fixture it names, else itself."""
    try:
        source = (ROOT / path).read_text(encoding="utf-8")
    except OSError:
        return path
    return next((group for fixture, group in SHARED_FIXTURE_GROUPS.items()
                 if re.search(rf"\b{fixture}\b", source)), path)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist: hand out whole files (and the files of one shared fixture together) to the workers."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return file_group(nodeid.split("::", 1)[0])

    return SharedFixtureScheduling(config, log)
