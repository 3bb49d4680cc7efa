"""`scaffold run` end to end on the benchmark_canned engine: episodes/s and peak RSS per run size.

    python bench/run_end_to_end.py                       # 10k and 100k episodes
    python bench/run_end_to_end.py --sizes 10000 100000 1000000
    python bench/run_end_to_end.py --sizes 10000 --repeat 3 --workers 1 2

Runs the real command line (``scaffold run CONFIG -o DIR``) in a child
process on the ``arithmetic`` task of ``scaffold_core.testing.plugin``
(synthetic rows made at run time, enabled with ``SCAFFOLD_EXTRA_PLUGINS``),
the native controller, the exact_match verifier and the byte tokenizer, with
a long system prompt and a long canned response so that each sample is about
1,000 tokens. Everything a user's run does is included: start-up, the ledger,
``samples.jsonl``, ``failures.jsonl``, the trajectories dataset and
``metrics.json``. Peak RSS is the child's own (``wait4``), launcher and
worker processes included (the largest of them).

The runtime-only figure runs the same episodes through ``Runtime`` in this
process with nothing persisted; the ratio says how close the whole command
comes to it (goal: within 2x, i.e. ratio >= 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_EPS = 5_000
GOAL_RSS_MB = 600
SYSTEM = ("You are a careful assistant. Solve the problem step by step, showing every intermediate result, "
          "and write the final answer on its own line after four hash signs. ") * 3
RESPONSE = ("Let me work through this carefully. First I read the two numbers, then I add the tens, then the "
            "ones, and I carry where the ones add up to ten or more. ") * 3 + "\n#### 42"
MAX_TOKENS = 512


def machine_line() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return f"machine: {cores} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def config_data(episodes: int, workers: int, save_dataset: bool = True) -> dict:
    return {
        "task": {"name": "arithmetic", "count": episodes, "system": SYSTEM},
        "engine": {"name": "benchmark_canned", "response": RESPONSE},
        "controller": {"name": "native"},
        "sampling": {"max_tokens": MAX_TOKENS},
        "rollout": {"progress": False, "concurrency": 64, "workers": workers},
        "output": {"save_dataset": save_dataset},
    }


def scaffold_command() -> list[str]:
    exe = Path(sys.executable).parent / "scaffold"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "scaffold_core.cli"]


def env_with_test_plugin() -> dict[str, str]:
    env = dict(os.environ)
    env["SCAFFOLD_EXTRA_PLUGINS"] = ",".join(
        filter(None, [env.get("SCAFFOLD_EXTRA_PLUGINS"), "scaffold_core.testing.plugin"]))
    return env


def run_cli(episodes: int, workers: int, root: Path, timeout: float, save_dataset: bool = True) -> dict:
    """One `scaffold run` in a child process; wall time, peak RSS (MB) and its metrics."""
    import yaml

    config = root / f"e2e-{episodes}-{workers}.yaml"
    config.write_text(yaml.safe_dump(config_data(episodes, workers, save_dataset)), encoding="utf-8")
    out = root / f"out-{episodes}-{workers}"
    if out.exists():
        shutil.rmtree(out)
    cmd = [*scaffold_command(), "run", str(config), "-o", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env_with_test_plugin())
    deadline = t0 + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            proc.wait(timeout=30)
            raise SystemExit(f"scaffold run with {episodes} episodes did not finish within {timeout:g} s")
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"scaffold run failed ({proc.returncode}):\n{err[-3000:]}")
    # wait4's ru_maxrss: the largest of the child and the descendants it waited for (the workers).
    peak_mb = usage.ru_maxrss / 1024
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    if metrics["episodes"] != episodes or metrics["completed"] != episodes:
        raise SystemExit(f"benchmark run incomplete: {metrics['episodes']} episodes, {metrics['completed']} completed")
    ledger_mb = sum(p.stat().st_size for p in out.glob("episodes*.jsonl")) / 1e6
    shutil.rmtree(out)
    cpu = usage.ru_utime + usage.ru_stime
    return {"episodes": episodes, "workers": workers, "wall_s": wall, "eps": episodes / wall, "cpu_s": cpu,
            "peak_rss_mb": peak_mb, "run_eps": metrics.get("episodes_per_s"), "ledger_mb": ledger_mb}


def runtime_only(episodes: int) -> tuple[float, float]:
    """(episodes/s, episodes per CPU-second) of the same episodes through the runtime alone (nothing persisted)."""
    from scaffold_core.config import load_config
    from scaffold_core.plugins import PluginSet
    from scaffold_core.run.assembly import Components, Limits
    from scaffold_core.run.runtime import Runtime
    from scaffold_core.run.verifier_pool import VerifierPool
    from scaffold_core.task import episode_context
    from scaffold_core.testing import plugin as test_plugin

    plugins = PluginSet().load(entry_points=False, extra={"testing": test_plugin})
    config = load_config(data=config_data(episodes, 1), registry=plugins.registry)
    comps = Components.from_config(config, plugins.registry)
    sampling = config.sampling.params()

    def contexts():
        for i, row in enumerate(comps.task.load()):
            yield episode_context(comps.task, i, row, comps.engine.tokenizer, sampling)

    async def main() -> tuple[float, float]:
        pool = VerifierPool(comps.verifier, timeout=30, workers=config.verifier_workers)
        runtime = Runtime(engine=comps.engine, controller=comps.controller, verifier=pool,
                          trajectory_maker=comps.trajectory_maker, limits=Limits(concurrency=64))
        await comps.engine.start()
        t0, c0 = time.perf_counter(), time.process_time()
        n = await runtime.run(contexts(), lambda result: None)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        pool.close()
        await comps.engine.close()
        assert n == episodes
        return episodes / wall, episodes / cpu

    return asyncio.run(main())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000],
                   help="episodes per run (default: 10000 100000; add 1000000 for the long one)")
    p.add_argument("--repeat", type=int, default=1, help="runs per size (the median is reported)")
    p.add_argument("--workers", type=int, nargs="+", default=[1], help="worker processes (default: 1)")
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds per run before it is killed")
    p.add_argument("--dir", help="where runs write (default: a temporary folder)")
    p.add_argument("--no-dataset", action="store_true",
                   help="output.save_dataset: false (the dataset of 1M 1,000-token episodes needs ~17 GB of disk)")
    args = p.parse_args()
    print(f"scaffold run end to end: benchmark_canned engine, arithmetic task, native controller, ~1,000 "
          f"byte tokens per sample; sizes {', '.join(f'{n:,}' for n in args.sizes)}; repeat {args.repeat}"
          + ("; without the trajectories dataset" if args.no_dataset else ""))
    print(machine_line())
    base, base_cpu = runtime_only(min(20_000, max(args.sizes)))
    print(f"runtime alone (same episodes, nothing persisted): {base:,.0f} episodes/s, "
          f"{base_cpu:,.0f} episodes/CPU-s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaffold-e2e-", dir=args.dir) as tmp:
        for workers in args.workers:
            for n in args.sizes:
                runs = [run_cli(n, workers, Path(tmp), args.timeout, not args.no_dataset) for _ in range(args.repeat)]
                rows.append((n, workers, statistics.median(r["eps"] for r in runs),
                             max(r["peak_rss_mb"] for r in runs), statistics.median(r["wall_s"] for r in runs),
                             runs[0]["ledger_mb"], statistics.median(n / r["cpu_s"] for r in runs)))
                print(f"  ran {n:,} episodes x{args.repeat} with {workers} worker(s): "
                      + ", ".join(f"{r['eps']:,.0f} ep/s ({r['cpu_s']:.1f} CPU s) {r['peak_rss_mb']:.0f} MB"
                                  for r in runs), flush=True)
    print(machine_line() + " (at the end)")
    print(f"{'episodes':>10} {'workers':>7} {'wall s':>8} {'episodes/s':>11} {'goal':>6} {'ratio to runtime':>17} "
          f"{'peak RSS MB':>12} {'goal':>5} {'ledger MB':>10} {'episodes/CPU-s':>15} {'CPU ratio':>9}")
    for n, workers, eps, rss, wall, ledger, per_cpu in rows:
        ok = "ok" if eps >= GOAL_EPS and rss <= GOAL_RSS_MB else "BELOW GOAL"
        print(f"{n:>10,} {workers:>7} {wall:>8.1f} {eps:>11,.0f} {GOAL_EPS:>6,} {eps / base:>17.2f} "
              f"{rss:>12.0f} {GOAL_RSS_MB:>5} {ledger:>10.0f} {per_cpu:>15,.0f} {per_cpu / base_cpu:>9.2f}  {ok}")
    print("episodes/CPU-s: episodes per second of CPU the command used (its own and its workers'), "
          "steadier than wall time on a shared machine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
