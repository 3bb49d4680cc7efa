"""The runtime's assembly: components start in order and close in reverse, also when a start fails half-way;
limits are one frozen record checked once."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from scaffold_testkit import ListTask, ScriptedEngine, plugin_set
from scaffold_testkit import plugin as test_tasks

from scaffold_core.builtins.controllers import NativeController
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.config import load_config
from scaffold_core.run.assembly import Components, Limits, started
from scaffold_core.run.runtime import Runtime


class Recorder:
    """An engine and a controller that write what happens to them into one list."""

    def __init__(self, log: list[str], fail_start: str | None = None):
        self.log = log
        self.fail_start = fail_start

    def parts(self) -> tuple[ScriptedEngine, NativeController]:
        recorder = self

        class Engine(ScriptedEngine):
            def attach_run(self, info):
                recorder.log.append("engine attached")

            async def start(self):
                recorder.log.append("engine start")
                if recorder.fail_start == "engine":
                    raise RuntimeError("no engine today")

            async def close(self):
                recorder.log.append("engine close")

        class Controller(NativeController):
            async def start(self):
                recorder.log.append("controller start")
                if recorder.fail_start == "controller":
                    raise RuntimeError("no controller today")

            async def close(self):
                recorder.log.append("controller close")

        return Engine(), Controller()


def components(log: list[str], fail_start: str | None = None, verified: bool = True) -> Components:
    engine, controller = Recorder(log, fail_start).parts()
    return Components(task=ListTask([]), controller=controller, engine=engine,
                      verifier=ExactMatchVerifier() if verified else None)


def test_started_starts_in_order_and_closes_in_reverse():
    from scaffold_core.engine import RunInfo

    log: list[str] = []

    async def main():
        async with started(components(log), Limits(verifier_timeout=5.0, verifier_workers=1),
                           run_info=RunInfo(rank=0)) as pool:
            log.append(f"running with a pool of {pool.workers}, timeout {pool.timeout:g}")

    asyncio.run(main())
    assert log == ["engine attached", "engine start", "controller start", "running with a pool of 1, timeout 5",
                   "controller close", "engine close"]


@pytest.mark.parametrize("failing, expected", [
    ("engine", ["engine start", "engine close"]),
    ("controller", ["engine start", "controller start", "controller close", "engine close"]),
])
def test_a_start_that_fails_half_way_closes_what_it_began(failing, expected):
    log: list[str] = []

    async def main():
        async with started(components(log, failing), Limits()):
            log.append("never runs")

    with pytest.raises(RuntimeError, match=f"no {failing} today"):
        asyncio.run(main())
    assert log == expected


def test_an_engine_the_caller_manages_is_neither_started_nor_closed_and_no_verifier_means_no_pool():
    log: list[str] = []

    async def main():
        async with started(components(log, verified=False), Limits(), manage_engine=False) as pool:
            log.append(f"pool {pool}")

    asyncio.run(main())
    assert log == ["controller start", "pool None", "controller close"]


@pytest.mark.parametrize("changes, message", [
    ({"concurrency": 0}, "concurrency must be an integer >= 1 or None"),
    ({"concurrency": 2.5}, "concurrency must be an integer >= 1 or None"),
    ({"retries": -1}, "retries must be an integer >= 0"),
    ({"request_timeout": 0}, "request_timeout must be a number of seconds > 0"),
    ({"episode_timeout": "soon"}, "episode_timeout must be a number of seconds > 0"),
])
def test_limits_refuse_what_cannot_bound_a_run(changes, message):
    with pytest.raises(ValueError, match=message):
        Limits(**changes)


def test_limits_are_frozen_and_read_from_a_config():
    limits = Limits(concurrency=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.concurrency = 3  # type: ignore[misc]
    pset = plugin_set(test_tasks)
    config = load_config(data={"task": {"name": "arithmetic", "count": 2}, "engine": {"name": "benchmark_canned"},
                               "rollout": {"concurrency": 5, "retries": 2, "request_timeout": 9},
                               "verifier": {"timeout": 4, "workers": 3}}, registry=pset.registry)
    assert Limits.from_config(config) == Limits(concurrency=5, request_timeout=9.0, episode_timeout=7200.0,
                                                retries=2, verifier_timeout=4.0, verifier_workers=3)
    built = Components.from_config(config, pset.registry)
    assert type(built.engine).__name__ == "CannedBenchmarkEngine" and built.verifier is not None


def test_a_runtime_without_a_bound_on_concurrency_runs_no_queue_of_episodes():
    runtime = Runtime(engine=ScriptedEngine(), controller=NativeController(), verifier=None,
                      limits=Limits(concurrency=None))
    with pytest.raises(ValueError, match="limits.concurrency is None"):
        asyncio.run(runtime.run([]))
