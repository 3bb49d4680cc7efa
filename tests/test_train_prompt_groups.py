"""TrainingRollouts: one prompt group through any controller on any engine, with per-token versions,
behaviour logprobs, fresh seeds per call, failures reported, and max_staleness (drop or regenerate)."""

from __future__ import annotations

import asyncio

import pytest
import scaffold_testkit.plugin as test_tasks
from scaffold_testkit import ListTask, ScriptedEngine, plugin_set

from scaffold_core.builtins.controllers import BestOfNController, NativeController
from scaffold_core.builtins.trajectories import GRPOTrajectoryMaker
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.config import load_config
from scaffold_core.run.assembly import Components, Limits
from scaffold_core.sampling import SamplingParams
from scaffold_core.train.prompt_groups import TrainingRollouts
from scaffold_core.train.staleness import StalenessPolicy, is_stale, oldest_version, staleness

ROWS = [{"id": "a", "question": "1 + 1?", "answer": "2"}, {"id": "b", "question": "2 + 2?", "answer": "4"}]


class VersionedEngine(ScriptedEngine):
    """A scripted engine with a weight version; ``bump_after`` requests in, a 'trainer' moves it on."""

    def __init__(self, *args, bump_after: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight_version = 0
        self.bump_after = bump_after

    async def generate(self, request):
        version = self.weight_version
        result = await super().generate(request)
        result.weight_version = version
        if self.bump_after is not None and len(self.requests) == self.bump_after:
            await self.update_weights(None)
        return result

    async def update_weights(self, source=None, *, version=None):
        self.weight_version = self.next_weight_version(version)
        return self.weight_version


def rollouts(engine=None, controller=None, *, max_staleness=None, on_stale="drop", concurrency=64, **options):
    components = Components(task=ListTask(ROWS), controller=controller or NativeController(),
                            engine=engine or VersionedEngine("2"), verifier=ExactMatchVerifier(),
                            trajectory_maker=GRPOTrajectoryMaker())
    return TrainingRollouts(components, sampling=SamplingParams(max_tokens=8, seed=3),
                            limits=Limits(concurrency=concurrency), staleness=StalenessPolicy(max_staleness, on_stale),
                            **options)


def run(r, coro_fn):
    async def main():
        async with r:
            return await coro_fn(r)

    return asyncio.run(main())


def test_a_group_holds_the_samples_asked_for_with_tokens_logprobs_and_versions():
    engine = VersionedEngine("2")
    r = rollouts(engine)
    groups = run(r, lambda r: r.run_groups(r.rows(), samples=4))
    assert engine.started and engine.closed
    assert [len(g.samples) for g in groups] == [4, 4] and [len(g.episodes) for g in groups] == [4, 4]
    a, b = groups
    assert a.rewards == [1.0] * 4 and b.rewards == [0.0] * 4
    for group in groups:
        assert {s.group_id for s in group.samples} == {group.group_id}
        assert len({s.episode_id for s in group.samples}) == 4
        for s in group.samples:
            n = s.prompt_len
            assert s.input_ids[:n] == group.prompt_ids and s.loss_mask == [0] * n + [1] * (len(s.input_ids) - n)
            assert s.versions == [-1] * n + [0] * (len(s.input_ids) - n)
            assert all(lp < 0 for lp in s.logprobs[n:])
    assert r.stats.to_dict() == {"groups": 2, "episodes": 8, "failed_episodes": 0, "samples": 8,
                                 "generated_tokens": 16, "stale_dropped": 0, "stale_regenerated": 0}


def test_seeds_differ_between_episodes_and_between_calls_and_repeat_across_runs():
    def seeds():
        engine = VersionedEngine("2")
        run(rollouts(engine), lambda r: _twice(r))
        return [q.seed for q in engine.requests]

    async def _twice(r):
        await r.run_group(ROWS[0], samples=3)
        await r.run_group(ROWS[0], samples=3)

    first = seeds()
    assert len(set(first)) == 6  # three episodes per call, two calls of the same row
    assert seeds() == first  # reproducible


def test_a_call_can_bring_its_own_sampling_and_group_id():
    """A trainer that sets sampling per request (verl) passes it per call; ids it names prefix every episode."""
    engine = VersionedEngine("2")
    r = rollouts(engine)
    hot = SamplingParams(max_tokens=6, temperature=0.5, top_p=0.9, top_k=7, seed=11)

    async def calls(r):
        first = await r.run_group(ROWS[0], samples=2, sampling=hot, group_id="worker-3:a")
        again = await r.run_group(ROWS[0], samples=2, sampling=hot, group_id="worker-3:a")
        other = await r.run_group(ROWS[0], samples=2, sampling=hot.replace(seed=12), group_id="worker-3:a")
        plain = await r.run_group(ROWS[0])
        return first, again, other, plain

    first, again, other, plain = run(r, calls)
    assert [q.sampling for q in engine.requests] == [hot] * 4 + [hot.replace(seed=12)] * 2 + [r.sampling]
    assert first.group_id == "worker-3:a" and {s.group_id for s in first.samples} == {"worker-3:a"}
    assert sorted(e.episode_id for e in first.episodes) == ["worker-3:a/0", "worker-3:a/1"]
    seeds = [q.seed for q in engine.requests]
    assert sorted(seeds[0:2]) == sorted(seeds[2:4])  # seeds follow the call's sampling.seed and the ids
    assert set(seeds[4:6]).isdisjoint(seeds[0:2])
    assert plain.group_id == "a@3" and first.rewards == [1.0, 1.0]
    with pytest.raises(ValueError, match="group_id"):
        run(rollouts(), lambda r: r.run_group(ROWS[0], group_id=""))
    with pytest.raises(TypeError, match="SamplingParams"):
        run(rollouts(), lambda r: r.run_group(ROWS[0], sampling={"temperature": 0.5}))


def test_concurrent_first_starts_start_everything_once():
    """A trainer's first episodes arrive together, each making sure the rollouts are started."""
    starts = []

    class Counting(NativeController):
        async def start(self):
            starts.append("controller")
            await asyncio.sleep(0.01)

    engine = VersionedEngine("2")
    r = rollouts(engine, controller=Counting(), manage_engine=False)

    async def main():
        async def one(row):
            await r.start()
            return await r.run_group(row)

        try:
            return await asyncio.gather(*(one(row) for row in ROWS * 3))
        finally:
            await r.close()

    groups = asyncio.run(main())
    assert starts == ["controller"] and [len(g.samples) for g in groups] == [1] * 6
    assert not engine.started and not engine.closed  # the caller's engine: never started or closed here


def test_controllers_with_several_samples_run_fewer_episodes_and_extra_samples_are_cut():
    r = rollouts(controller=BestOfNController(samples=2))
    group = run(r, lambda r: r.run_group(ROWS[0], samples=5))
    assert len(group.episodes) == 3 and len(group.samples) == 5
    one = run(rollouts(controller=BestOfNController(samples=2)), lambda r: r.run_group(ROWS[0]))
    assert len(one.episodes) == 1 and len(one.samples) == 2  # samples=None: one episode, all it made


def test_failed_episodes_are_reported_not_hidden():
    engine = VersionedEngine("2", fail=lambda prompt: "2 + 2" in prompt)
    groups = run(rollouts(engine), lambda r: r.run_groups(r.rows(), samples=2))
    ok, failed = groups
    assert len(ok.samples) == 2 and not ok.failed
    assert failed.samples == [] and len(failed.failed) == 2
    assert failed.failed[0].error_component == "engine" and "injected engine failure" in failed.failed[0].error


def test_stale_samples_are_dropped_and_counted():
    engine = VersionedEngine("2", bump_after=2)  # two samples on version 0, then the weights move to 1
    r = rollouts(engine, max_staleness=0, concurrency=1)
    group = run(r, lambda r: r.run_group(ROWS[0], samples=4))
    assert [oldest_version(s) for s in group.samples] == [1, 1]
    assert group.stale_dropped == 2 and r.stats.stale_dropped == 2 and r.stats.samples == 2


def test_stale_groups_are_regenerated_on_the_current_weights():
    engine = VersionedEngine("2", bump_after=2)
    r = rollouts(engine, max_staleness=0, on_stale="regenerate", concurrency=1)
    group = run(r, lambda r: r.run_group(ROWS[0], samples=4))
    assert len(group.samples) == 4 and {oldest_version(s) for s in group.samples} == {1}
    assert group.regenerations == 1 and r.stats.stale_regenerated == 1 and group.stale_dropped == 0
    assert len(engine.requests) == 8


def test_samples_within_max_staleness_are_kept():
    engine = VersionedEngine("2", bump_after=2)
    r = rollouts(engine, max_staleness=1, concurrency=1)
    group = run(r, lambda r: r.run_group(ROWS[0], samples=4))
    assert len(group.samples) == 4 and r.stats.stale_dropped == 0


def test_staleness_counts_versions_of_generated_tokens_only():
    sample = {"versions": [-1, -1, 3, 5, -1], "loss_mask": [0, 0, 1, 1, 0]}
    assert oldest_version(sample) == 3 and staleness(sample, 6) == 3
    assert is_stale(sample, 6, 2) and not is_stale(sample, 6, 3) and not is_stale(sample, 6, None)
    assert staleness({"versions": [-1], "loss_mask": [0]}, 9) == 0


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="max_staleness"):
        rollouts(max_staleness=-1)
    with pytest.raises(ValueError, match="on_stale"):
        rollouts(on_stale="keep")
    with pytest.raises(RuntimeError, match="not started"):
        asyncio.run(rollouts().run_group(ROWS[0]))


def test_from_config_reads_the_rollout_section():
    pset = plugin_set(test_tasks)
    config = load_config(data={"task": {"name": "list", "rows": ROWS},
                               "engine": {"name": "benchmark_canned", "response": "2"},
                               "controller": {"name": "native", "samples": 2},
                               "rollout": {"max_staleness": 1, "on_stale": "regenerate", "retries": 1}},
                         registry=pset.registry)
    r = TrainingRollouts.from_config(config, registry=pset.registry)
    assert (r.staleness.max_staleness, r.staleness.on_stale, r.limits.retries, r.sampling.max_tokens) == (
        1, "regenerate", 1, 32)
    groups = run(r, lambda r: r.run_groups(r.rows(), samples=4))
    assert [len(g.episodes) for g in groups] == [2, 2] and [g.rewards for g in groups] == [[1.0] * 4, [0.0] * 4]
