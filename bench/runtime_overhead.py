"""Runtime overhead on the benchmark-only canned engine (no model): episodes/s and peak memory.

Measures the whole per-episode path a real run takes: controller clone and
generator, engine call, verification in the verifier pool (off the event
loop), trajectory making. The engine returns canned tokens instantly, so what
is left is scaffold's own cost.

    python bench/runtime_overhead.py            # episodes/s table + peak RSS at 10,000 concurrent
    python bench/runtime_overhead.py --rss-only N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
from scaffold_core.run.runtime import Runtime
from scaffold_core.run.verifier_pool import VerifierPool
from scaffold_core.sampling import SamplingParams, derive_seed

PROMPT = "<|system|>\nSolve step by step.<|end|>\n<|user|>\nWhat is 6 * 7?<|end|>\n<|assistant|>\n"


def contexts(engine: CannedBenchmarkEngine, n: int):
    ids = engine.tokenizer.encode(PROMPT)
    sampling = SamplingParams(max_tokens=64)
    for i in range(n):
        eid = f"e{i}"
        yield EpisodeContext(episode_id=eid, index=i, row={"id": eid}, prompt_ids=ids, sampling=sampling,
                             seed=derive_seed(0, eid), reference="#### 42", prompt_text=PROMPT)


async def measure(controller, episodes: int, concurrency: int) -> dict:
    engine = CannedBenchmarkEngine(response="Adding them gives 42.\n#### 42")
    pool = VerifierPool(ExactMatchVerifier(), timeout=30, workers=2)
    done = 0
    rewards = 0.0

    def on_result(result):
        nonlocal done, rewards
        done += result.ok
        rewards += sum(len(t.input_ids) for t in result.trajectories)

    runtime = Runtime(engine=engine, controller=controller, verifier=pool,
                      trajectory_maker=SingleTurnTrajectoryMaker(), concurrency=concurrency)
    start, cpu = time.perf_counter(), time.process_time()
    await runtime.run(contexts(engine, episodes), on_result)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    pool.close()
    assert done == episodes, (done, episodes)
    return {"episodes": episodes, "wall_s": round(wall, 3), "episodes_per_s": round(episodes / wall, 1),
            "episodes_per_cpu_s": round(episodes / cpu, 1), "requests": engine.requests}


#: Figures before the shared-timer deadlines and the other runtime work (2-core machine), and the goals.
BEFORE = {("native", 64): "~7,000-9,300", ("native", 1024): "~7,000-9,300",
          ("majority_vote x8", 64): "~1,050-1,440", ("majority_vote x8", 1024): "~1,050-1,440"}


def machine_line() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return f"machine: {cores} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def rss_child(n: int) -> None:
    """Run n episodes with n in flight; print peak RSS (MiB)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    asyncio.run(measure(MajorityVoteController(samples=8), n, n))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rss_mib": round(peak / 1024, 1), "baseline_rss_mib": round(before / 1024, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=20000)
    parser.add_argument("--rss-only", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (the median is reported)")
    args = parser.parse_args()
    if args.rss_only:
        rss_child(args.rss_only)
        return
    print(machine_line())
    rows = []
    for name, make, n, target in (("native", NativeController, args.episodes, 10_000),
                                  ("majority_vote x8", lambda: MajorityVoteController(samples=8),
                                   args.episodes // 4, 1_500)):
        for concurrency in (64, 1024):
            asyncio.run(measure(make(), min(n, 2000), concurrency))  # warm-up
            runs = [asyncio.run(measure(make(), n, concurrency)) for _ in range(args.repeat)]
            rows.append((name, concurrency, statistics.median(r["episodes_per_s"] for r in runs),
                         statistics.median(r["episodes_per_cpu_s"] for r in runs), target))
    print(f"runtime overhead (benchmark_canned engine; verification + trajectories included; "
          f"median of {args.repeat})")
    print(f"{'controller':<18}{'concurrency':>12}{'episodes/s':>12}{'per CPU-s':>11}{'before':>15}{'goal':>8}"
          f"{'ratio':>7}")
    for name, conc, eps, per_cpu, target in rows:
        print(f"{name:<18}{conc:>12}{eps:>12,.0f}{per_cpu:>11,.0f}{BEFORE[(name, conc)]:>15}{target:>8,}"
              f"{eps / target:>7.2f}  {'ok' if eps >= target else 'BELOW GOAL'}")
    print("per CPU-s: episodes per second of CPU this process used (the verifier thread included): what the "
          "machine's load does not change")
    print(machine_line() + " (at the end)")
    out = subprocess.run([sys.executable, __file__, "--rss-only", "10000"], capture_output=True, text=True,
                         timeout=600, check=True).stdout
    rss = json.loads(out.strip().splitlines()[-1])
    print(f"peak RSS, 10,000 concurrent majority_vote x8 episodes: {rss['peak_rss_mib']:.0f} MiB "
          f"(target < 1024 MiB)  {'ok' if rss['peak_rss_mib'] < 1024 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
