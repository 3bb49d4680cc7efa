"""How many threads the embedded engine takes on a CPU when not told."""

from __future__ import annotations

import os

import pytest

from scaffold_core.distributed.env import usable_cores
from scaffold_transformers.core_share import CoreShare


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs os.sched_getaffinity")
@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (8, 7)])
def test_a_cpu_engine_leaves_one_core_of_the_process_free(monkeypatch, cores, threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    set_to = []

    class Torch:
        set_num_threads = set_to.append

    CoreShare(Torch, usable_cores()).start()  # what the engine starts on, before it has looked at the machine
    assert set_to == [threads]
