"""How many threads the embedded engine takes on a CPU when not told."""

from __future__ import annotations

import os

import pytest

from scaffold_transformers.transformers_engine import auto_threads


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs os.sched_getaffinity")
@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (8, 7)])
def test_a_cpu_engine_leaves_one_core_of_the_process_free(monkeypatch, cores, threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert auto_threads() == threads
