"""Multi-worker speed-up: 1 vs 2 worker processes on the benchmark_canned engine.

    python bench/multiworker.py [--episodes 6000] [--workers 1 2]

Runs the ``arithmetic`` test task (``scaffold_testkit.plugin``) through
``scaffold_core.launch.run_workers`` with the model taken out, so the figures
measure scaffold's own per-episode work (scheduling, verification,
trajectories, the ledger) spread over processes. Prints, per worker count,
episodes/s once the workers run (``episodes / slowest worker's wall``),
episodes/s end to end (process start-up and the merge included), and the
speed-up of each over one worker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def run(workers: int, episodes: int, root: Path) -> dict:
    from scaffold_core.config import load_config
    from scaffold_core.launch import run_workers

    config = load_config(data={
        "task": {"name": "arithmetic", "count": episodes},
        "engine": {"name": "benchmark_canned"},
        "sampling": {"max_tokens": 64},
        "rollout": {"workers": workers, "progress": False, "concurrency": 64},
        "output": {"dir": str(root / f"w{workers}"), "save_dataset": False},
    })
    t0 = time.perf_counter()
    metrics = run_workers(config)
    total = time.perf_counter() - t0
    if metrics.get("worker_failures") or metrics["episodes"] != episodes:
        raise SystemExit(f"benchmark run failed: {json.dumps(metrics.get('worker_failures'))}")
    return {"workers": workers, "episodes": episodes, "run_eps": metrics["episodes_per_s"],
            "end_to_end_eps": round(episodes / total, 1), "end_to_end_s": round(total, 2)}


#: 2 workers on 2 cores before the streamed, multi-process derived files, and the goal.
BEFORE = {"running": "1.77x", "end to end": "1.48x"}
GOAL = 1.8


def machine_line() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return f"machine: {cores} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=6000)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeat", type=int, default=1, help="runs per worker count (the median is reported)")
    args = p.parse_args()
    os.environ["SCAFFOLD_EXTRA_PLUGINS"] = ",".join(
        filter(None, [os.environ.get("SCAFFOLD_EXTRA_PLUGINS"), "scaffold_testkit.plugin"]))
    print(f"multiworker: benchmark_canned engine, {args.episodes} episodes; {machine_line()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaffold-bench-") as tmp:
        for n in args.workers:
            runs = [run(n, args.episodes, Path(tmp) / f"r{i}") for i in range(args.repeat)]
            rows.append({key: statistics.median(r[key] for r in runs) if key != "workers" else n
                         for key in runs[0]})
    base = rows[0]
    print(f"{'workers':>7} {'episodes/s (running)':>21} {'speed-up':>8} {'episodes/s (end to end)':>24} "
          f"{'speed-up':>8} {'wall s':>7}")
    for r in rows:
        print(f"{r['workers']:>7} {r['run_eps']:>21.1f} {r['run_eps'] / base['run_eps']:>7.2f}x "
              f"{r['end_to_end_eps']:>24.1f} {r['end_to_end_eps'] / base['end_to_end_eps']:>7.2f}x "
              f"{r['end_to_end_s']:>7.2f}")
    if len(rows) > 1 and rows[0]["workers"] == 1:
        last = rows[-1]
        for label, key in (("running", "run_eps"), ("end to end", "end_to_end_eps")):
            ratio = last[key] / base[key]
            print(f"{last['workers']} workers, {label}: {ratio:.2f}x (before {BEFORE[label]}, goal >= {GOAL}x "
                  f"with 2 workers on 2 cores)  {'ok' if ratio >= GOAL else 'BELOW GOAL'}")
    print(machine_line() + " (at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
