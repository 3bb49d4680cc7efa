"""Root conftest: the whole suite (core and every plugin) runs under the leak guard.

`make test` runs the suite on two pytest-xdist workers. A test file's tests run on one worker, in order
(its module fixtures are built once), and so do all the tests, across files, that need an expensive session
fixture, so that it is built once: the release checkout where `make dist` ran, the bundled SmolLM2 engine,
and the pip-installed fixture plugins (docs/testing.md).
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
#: the groups handed out first, in this order (the slowest)
FIRST_GROUPS = ("smollm2", "release")


#: The parameter lists of the functions and methods a file defines (not ones in strings, such as the test files
#: that pytester tests write: those are indented further).
SIGNATURE = re.compile(r"^ {0,4}(?:async\s+)?def\s+\w+\s*\(([^)]*)\)", re.MULTILINE)


@cache
def file_group(path: str) -> str:
    """The worker group of a test file: the group of the first shared session fixture one of its functions asks
    for (as a parameter), else the file itself."""
    try:
        source = (ROOT / path).read_text(encoding="utf-8")
    except OSError:
        return path
    parameters = " ".join(SIGNATURE.findall(source))
    return next((group for fixture, group in SHARED_FIXTURE_GROUPS.items()
                 if re.search(rf"\b{fixture}\b", parameters)), path)


@cache
def _free_functions(path: str) -> frozenset[str]:
    """The module-level functions of a file in a shared group that need none of its shared fixtures, directly
    or through the file's own fixtures (a closure over the file's module-level functions)."""
    import ast

    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    defs = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    functions = {node.name: {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
                 for node in defs}
    users = set(SHARED_FIXTURE_GROUPS)
    while more := {name for name, args in functions.items() if name not in users and args & users}:
        users |= more
    autouse = {node.name for node in defs if any("autouse" in ast.unparse(d) for d in node.decorator_list)}
    if autouse & users:
        return frozenset()  # an autouse fixture needs a shared one: so does every test
    return frozenset(name for name in functions if name not in users)


def test_group(nodeid: str) -> str:
    """The worker group of a test: its file's group, except that a module-level test of a shared group's file
    that needs none of the shared fixtures stays with its file's other such tests (and may run on either
    worker)."""
    path, _, rest = nodeid.partition("::")
    group = file_group(path)
    if group == path or "::" in rest:  # a file of its own, or a test class: the class goes with the group
        return group
    try:
        free = _free_functions(path)
    except (OSError, SyntaxError):
        return group
    return path if rest.split("[", 1)[0] in free else group


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist: hand out whole files (and the files of one shared fixture together) to the workers."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return test_group(nodeid)

        def _assign_work_unit(self, node) -> None:
            # xdist queues the groups by their number of tests; the shared-fixture groups are the longest by
            # far for their count (a model, a release build), so they start first: one left for the end would
            # keep one worker busy while the other idles.
            for group in reversed(FIRST_GROUPS):
                if group in self.workqueue:
                    self.workqueue.move_to_end(group, last=False)
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)
