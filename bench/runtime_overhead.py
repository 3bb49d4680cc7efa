"""Runtime overhead on the benchmark-only canned engine (no model): episodes/s and peak memory.

Measures the whole per-episode path a real run takes: controller clone and
generator, engine call, verification in the verifier pool (off the event
loop), trajectory making. The engine returns canned tokens instantly, so what
is left is scaffold's own cost.

It also prices isolation by construction (every episode's controller a
deep copy but for declared shared handles, every parallel branch its own
copy of the episode's row, messages and state): the same runs with
controllers and contexts that copy the way the runtime did before
(``clone()`` a shallow copy, branches sharing the episode's data), in the
same process, interleaved, ``--repeats`` times each; it prints the medians,
their ratio and the goal (isolated >= 90% of today's episodes/s), and the
machine they ran on (the load average says how busy it was).

    python bench/runtime_overhead.py                    # everything
    python bench/runtime_overhead.py --isolation-only   # the before/after isolation figures only
    python bench/runtime_overhead.py --no-isolation     # the table and peak RSS only
    python bench/runtime_overhead.py --rss-only N
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

from scaffold_core.builtins.controllers import MajorityVoteController, NativeController
from scaffold_core.builtins.trajectories import SingleTurnTrajectoryMaker
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.engines.canned import CannedBenchmarkEngine
from scaffold_core.episode import EpisodeContext
from scaffold_core.run.assembly import Limits
from scaffold_core.run.runtime import Runtime
from scaffold_core.run.verifier_pool import VerifierPool
from scaffold_core.sampling import SamplingParams, derive_seed

PROMPT = "<|system|>\nSolve step by step.<|end|>\n<|user|>\nWhat is 6 * 7?<|end|>\n<|assistant|>\n"


#: The isolation goal: episodes/s with isolation at least this fraction of today's (shared) figure.
ISOLATION_GOAL = 0.90


class _SharingContext(EpisodeContext):
    """Before isolation by construction: parallel branches shared the episode's row, messages and prompt ids."""

    __slots__ = ()

    def branch(self, index: int) -> EpisodeContext:
        return EpisodeContext(
            episode_id=self.episode_id, index=self.index, row=self.row, prompt_ids=self.prompt_ids,
            sampling=self.sampling, seed=self.seed, reference=self.reference, prompt_text=self.prompt_text,
            messages=self.messages, tokenizer=self.tokenizer, attempt=self.attempt,
            sample_base=self.sample_base + index)


class _ShallowNative(NativeController):
    """Before: NativeController.clone() was a shallow copy (inherited, unsafely, by every subclass)."""

    def clone(self):
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin


class _ShallowMajorityVote(MajorityVoteController):
    """Before: copy.copy of the controller plus a clone of its generator."""

    def clone(self):
        twin = copy.copy(self)
        twin.generator = self.generator.clone()
        return twin


def contexts(engine: CannedBenchmarkEngine, n: int, context_class: type = EpisodeContext):
    ids = engine.tokenizer.encode(PROMPT)
    sampling = SamplingParams(max_tokens=64)
    for i in range(n):
        eid = f"e{i}"
        yield context_class(episode_id=eid, index=i, row={"id": eid}, prompt_ids=ids, sampling=sampling,
                            seed=derive_seed(0, eid), reference="#### 42", prompt_text=PROMPT)


async def measure(controller, episodes: int, concurrency: int, context_class: type = EpisodeContext) -> dict:
    engine = CannedBenchmarkEngine(response="Adding them gives 42.\n#### 42")
    pool = VerifierPool(ExactMatchVerifier(), timeout=30, workers=2)
    done = 0
    rewards = 0.0

    def on_result(result):
        nonlocal done, rewards
        done += result.ok
        rewards += sum(len(t.input_ids) for t in result.trajectories)

    runtime = Runtime(engine=engine, controller=controller, verifier=pool,
                      trajectory_maker=SingleTurnTrajectoryMaker(), limits=Limits(concurrency=concurrency))
    start, cpu_start = time.perf_counter(), time.process_time()
    await runtime.run(contexts(engine, episodes, context_class), on_result)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    pool.close()
    assert done == episodes, (done, episodes)
    return {"episodes": episodes, "wall_s": round(wall, 3), "episodes_per_s": round(episodes / wall, 1),
            "episodes_per_cpu_s": round(episodes / cpu, 1) if cpu > 0 else 0.0, "requests": engine.requests}


def rss_child(n: int) -> None:
    """Run n episodes with n in flight; print peak RSS (MiB)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    asyncio.run(measure(MajorityVoteController(samples=8), n, n))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rss_mib": round(peak / 1024, 1), "baseline_rss_mib": round(before / 1024, 1)}))


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def isolation_figures(episodes: int, repeats: int) -> None:
    """Today's copying (shallow clone, shared branch data) against isolation by construction, interleaved.

    Runs alternate A-B-B-A so drift in the machine's load falls on both
    sides. Episodes per wall-clock second is what a user sees; episodes per
    CPU-second (this process's CPU time, all threads) is the same work
    priced without the other tenants of a shared machine, and it decides the
    verdict.
    """
    load_before = load_average()
    cases = (
        ("native", NativeController, _ShallowNative, episodes, 64),
        ("native", NativeController, _ShallowNative, episodes, 1024),
        ("majority_vote x8", lambda: MajorityVoteController(samples=8),
         lambda: _ShallowMajorityVote(samples=8, generator=_ShallowNative()), episodes // 4, 64),
        ("majority_vote x8", lambda: MajorityVoteController(samples=8),
         lambda: _ShallowMajorityVote(samples=8, generator=_ShallowNative()), episodes // 4, 1024),
    )
    print(f"isolation cost (benchmark_canned engine; medians of {repeats} runs per side, interleaved A-B-B-A)")
    for name, isolated, today, n, concurrency in cases:
        sides = {"today": (today, _SharingContext), "isolated": (isolated, EpisodeContext)}
        for make, context_class in sides.values():  # warm-up
            asyncio.run(measure(make(), min(n, 2000), concurrency, context_class))
        runs: dict[str, list[dict]] = {"today": [], "isolated": []}
        for i in range(repeats):
            for side in (("today", "isolated") if i % 2 == 0 else ("isolated", "today")):
                make, context_class = sides[side]
                runs[side].append(asyncio.run(measure(make(), n, concurrency, context_class)))
        print(f"{name} at concurrency {concurrency}, {n:,} episodes per run:")
        medians = {}
        for side, how in (("today", "shallow clone, branches share the episode's data"),
                          ("isolated", "deep copy but shared handles, copy-on-branch")):
            wall = [r["episodes_per_s"] for r in runs[side]]
            cpu = [r["episodes_per_cpu_s"] for r in runs[side]]
            medians[side] = (statistics.median(wall), statistics.median(cpu))
            print(f"  {side:<9} {medians[side][0]:>8,.0f} episodes/s, {medians[side][1]:>8,.0f} per CPU-s  ({how}; "
                  f"runs {', '.join(f'{x:,.0f}' for x in wall)} /s)")
        wall_ratio = medians["isolated"][0] / medians["today"][0]
        cpu_ratio = medians["isolated"][1] / medians["today"][1]
        verdict = "ok" if cpu_ratio >= ISOLATION_GOAL else "BELOW GOAL"
        print(f"  ratio     {wall_ratio:>8.3f} wall, {cpu_ratio:>8.3f} CPU   goal >= {ISOLATION_GOAL:.2f} of today  "
              f"{verdict}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, load average (1/5/15 min) {load_before} before, "
          f"{load_average()} after; Python {platform.python_version()}, {platform.system()} {platform.release()}")


#: Figures before the shared-timer deadlines and the other runtime work (2-core machine), and the goals.
BEFORE = {("native", 64): "~7,000-9,300", ("native", 1024): "~7,000-9,300",
          ("majority_vote x8", 64): "~1,050-1,440", ("majority_vote x8", 1024): "~1,050-1,440"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per side of the isolation figures")
    parser.add_argument("--isolation-only", action="store_true", help="print only the before/after isolation figures")
    parser.add_argument("--no-isolation", action="store_true", help="leave out the before/after isolation figures")
    parser.add_argument("--rss-only", type=int, default=0)
    args = parser.parse_args()
    if args.rss_only:
        rss_child(args.rss_only)
        return
    if args.isolation_only:
        isolation_figures(args.episodes, args.repeats)
        return
    load_before = load_average()
    rows = []
    for name, make, n, target in (("native", NativeController, args.episodes, 10_000),
                                  ("majority_vote x8", lambda: MajorityVoteController(samples=8),
                                   args.episodes // 4, 1_500)):
        for concurrency in (64, 1024):
            asyncio.run(measure(make(), min(n, 2000), concurrency))  # warm-up
            runs = [asyncio.run(measure(make(), n, concurrency)) for _ in range(args.repeats)]
            rows.append((name, concurrency, statistics.median(r["episodes_per_s"] for r in runs),
                         statistics.median(r["episodes_per_cpu_s"] for r in runs), target))
    print(f"runtime overhead (benchmark_canned engine; verification + trajectories included; "
          f"median of {args.repeats})")
    print(f"{'controller':<18}{'concurrency':>12}{'episodes/s':>12}{'per CPU-s':>11}{'before':>15}{'goal':>8}"
          f"{'ratio':>7}")
    for name, conc, eps, per_cpu, target in rows:
        print(f"{name:<18}{conc:>12}{eps:>12,.0f}{per_cpu:>11,.0f}{BEFORE[(name, conc)]:>15}{target:>8,}"
              f"{eps / target:>7.2f}  {'ok' if eps >= target else 'BELOW GOAL'}")
    print(f"per CPU-s: episodes per second of CPU this process used (the verifier thread included); machine: "
          f"{cpu_model()}, {os.cpu_count()} CPUs, load average (1/5/15 min) {load_before} before, "
          f"{load_average()} after")
    out = subprocess.run([sys.executable, __file__, "--rss-only", "10000"], capture_output=True, text=True,
                         timeout=600, check=True).stdout
    rss = json.loads(out.strip().splitlines()[-1])
    print(f"peak RSS, 10,000 concurrent majority_vote x8 episodes: {rss['peak_rss_mib']:.0f} MiB "
          f"(target < 1024 MiB)  {'ok' if rss['peak_rss_mib'] < 1024 else 'ABOVE TARGET'}")
    if not args.no_isolation:
        print()
        isolation_figures(args.episodes, args.repeats)


if __name__ == "__main__":
    main()
