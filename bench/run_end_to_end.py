"""`scaffold run` end to end on the benchmark_canned engine: episodes/s and peak RSS per run size.

    python bench/run_end_to_end.py                       # 10k and 100k episodes
    python bench/run_end_to_end.py --sizes 40000 200000 --repeat 3
    python bench/run_end_to_end.py --sizes 1000000 --no-dataset
    python bench/run_end_to_end.py --sizes 10000 --repeat 3 --workers 1 2
    python bench/run_end_to_end.py --spans --sizes 20000 --repeat 5   # the cost of recording spans (goal <= 5%)
    python bench/run_end_to_end.py --spans --instructions --sizes 1000 4000   # the same, counted (valgrind)

Runs the real command line (``scaffold run CONFIG -o DIR``) in a child
process (after a small first run, which writes Python's bytecode cache as a
user's first run does) on the ``arithmetic`` task of
``scaffold_testkit.plugin`` (synthetic rows made at run time, enabled
with ``SCAFFOLD_EXTRA_PLUGINS``), the native controller, the exact_match
verifier and the byte tokenizer, with a long system prompt and a long canned
response so that each sample is about 1,000 tokens. Everything a user's run
does is included: start-up, the store, ``samples.jsonl``,
``failures.jsonl``, the trajectories dataset and ``metrics.json``. Peak RSS
is the child's own (``wait4``), launcher and worker processes included (the
largest of them).

The runtime-only figure runs the same episodes through ``Runtime`` in a
child process of its own with nothing persisted, just before and just after
each run of the command, and the two are averaged (side by side: on a shared
machine the speed changes from minute to minute); the ratio of the command's
episodes/s to it says how close the whole command comes to its runtime
(goal: within 2x, i.e. ratio >= 0.5). With ``--repeat`` the median ratio is
reported with the lowest and highest, the noise of the machine. Bytes:
everything the run writes per episode (its store, samples, failures, dataset,
metrics, report), and its ratio to the trajectories dataset alone
(goal: <= 1.5).

``--spans`` measures what recording each episode's spans costs instead: the
same command with ``output.spans`` on and off, alternately (on, off, off, on,
...: each pair side by side on a machine whose speed changes from minute to
minute), ``--repeat`` pairs per size; it prints each run's episodes/s and
episodes per CPU-second and the median of the pairs' ratios (goal: spans cost
at most 5%, i.e. on/off >= 0.95). The command's figure includes what the spans
add at its end (the report's Time section and ``trace.json``); the runtime
alone with and without recording (same episodes, nothing persisted) gives the
cost of the recording itself.

``--spans --instructions`` counts instead of timing: each run of the command
under valgrind's callgrind, which counts the instructions the process
executes (about 50 times slower, so smaller sizes), spans on and off side
by side (two at once). A count does not drift with the machine's speed as
seconds do (on a shared 2-core machine a run's time varies by 10-20%
from minute to minute, more than the cost measured): it gives each size's
whole-command ratio and, between the two sizes, the instructions each further
episode costs with and without spans (their ratio: the cost without the
start-up and the report's fixed part). Cache misses are not counted.
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

GOAL_RATIO = 0.5
GOAL_RSS_MB = 600
GOAL_BYTES = 1.5
SYSTEM = ("You are a careful assistant. Solve the problem step by step, showing every intermediate result, "
          "and write the final answer on its own line after four hash signs. ") * 3
RESPONSE = ("Let me work through this carefully. First I read the two numbers, then I add the tens, then the "
            "ones, and I carry where the ones add up to ten or more. ") * 3 + "\n#### 42"
MAX_TOKENS = 512


def machine_line() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return f"machine: {cores} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def config_data(episodes: int, workers: int, save_dataset: bool = True, spans: bool = True) -> dict:
    return {
        "task": {"name": "arithmetic", "count": episodes, "system": SYSTEM},
        "engine": {"name": "benchmark_canned", "response": RESPONSE},
        "controller": {"name": "native"},
        "sampling": {"max_tokens": MAX_TOKENS},
        "rollout": {"progress": False, "concurrency": 64, "workers": workers},
        "output": {"save_dataset": save_dataset, "spans": spans},
    }


def scaffold_command() -> list[str]:
    exe = Path(sys.executable).parent / "scaffold"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "scaffold_core.cli"]


def env_with_test_plugin() -> dict[str, str]:
    """The environment of the measured commands: the test plugin on, and Python's bytecode cache on (a shell
    that sets ``PYTHONDONTWRITEBYTECODE`` would have every run compile the project's modules again, which a
    user's runs do not: an installed package is compiled when it is installed, a checkout on its first run)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["SCAFFOLD_EXTRA_PLUGINS"] = ",".join(
        filter(None, [env.get("SCAFFOLD_EXTRA_PLUGINS"), "scaffold_testkit.plugin"]))
    return env


def run_cli(episodes: int, workers: int, root: Path, timeout: float, save_dataset: bool = True,
            spans: bool = True) -> dict:
    """One `scaffold run` in a child process; wall time, peak RSS (MB) and its metrics."""
    import yaml

    config = root / f"e2e-{episodes}-{workers}.yaml"
    config.write_text(yaml.safe_dump(config_data(episodes, workers, save_dataset, spans)), encoding="utf-8")
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
    ledger_mb = sum(p.stat().st_size for p in out.glob("episodes*")) / 1e6
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    dataset = sum(p.stat().st_size for p in (out / "trajectories").rglob("*") if p.is_file())
    shutil.rmtree(out)
    cpu = usage.ru_utime + usage.ru_stime
    return {"episodes": episodes, "workers": workers, "wall_s": wall, "eps": episodes / wall, "cpu_s": cpu,
            "peak_rss_mb": peak_mb, "run_eps": metrics.get("episodes_per_s"), "ledger_mb": ledger_mb,
            "bytes_per_episode": total / episodes, "bytes_ratio": total / dataset if dataset else float("nan")}


def runtime_only(episodes: int, spans: bool = True) -> tuple[float, float]:
    """(episodes/s, episodes per CPU-second) of the same episodes through the runtime alone (nothing persisted)."""
    from scaffold_testkit import plugin as test_plugin

    from scaffold_core.config import load_config
    from scaffold_core.plugins import PluginSet
    from scaffold_core.run.assembly import Components, Limits
    from scaffold_core.run.runtime import Runtime
    from scaffold_core.run.verifier_pool import VerifierPool
    from scaffold_core.task import episode_context

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
                          trajectory_maker=comps.trajectory_maker, limits=Limits(concurrency=64),
                          record_spans=spans)
        await comps.engine.start()
        t0, c0 = time.perf_counter(), time.process_time()
        n = await runtime.run(contexts(), lambda result: None)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        pool.close()
        await comps.engine.close()
        assert n == episodes
        return episodes / wall, episodes / cpu

    return asyncio.run(main())


def runtime_child(episodes: int, spans: bool = True) -> tuple[float, float]:
    """:func:`runtime_only` in a fresh child process (as the command runs in one): (episodes/s, per CPU-s)."""
    proc = subprocess.run([sys.executable, __file__, "--runtime-only", str(episodes)]
                          + ([] if spans else ["--runtime-no-spans"]), capture_output=True,
                          text=True, timeout=3600, env=env_with_test_plugin())
    if proc.returncode != 0:
        raise SystemExit(f"the runtime-only measurement failed:\n{proc.stderr[-3000:]}")
    eps, per_cpu = json.loads(proc.stdout.strip().splitlines()[-1])
    return eps, per_cpu


def spread(values: list[float]) -> str:
    """The median, and the lowest and highest when there are several."""
    med = statistics.median(values)
    return f"{med:.2f}" if len(values) == 1 else f"{med:.2f} ({min(values):.2f}-{max(values):.2f})"


GOAL_SPANS = 0.95


def spans_cost(args: argparse.Namespace) -> int:
    """``--spans``: the command with spans on and off, alternately; the ratio of their speeds."""
    print(f"the cost of recording spans: scaffold run on the benchmark_canned engine, spans on and off alternately "
          f"(on, off, off, on, ...), {args.repeat} pairs per size" + ("; without the trajectories dataset"
                                                                         if args.no_dataset else ""))
    print(machine_line())
    ok = True
    with tempfile.TemporaryDirectory(prefix="scaffold-e2e-", dir=args.dir) as tmp:
        run_cli(200, 1, Path(tmp), args.timeout)  # the bytecode cache
        for n in args.sizes:
            ratios, cpu_ratios, runtime_ratios = [], [], []
            for pair in range(args.repeat):
                order = (True, False) if pair % 2 == 0 else (False, True)
                runs = {}
                for spans in order:
                    runs[spans] = run_cli(n, 1, Path(tmp), args.timeout, not args.no_dataset, spans)
                on, off = runs[True], runs[False]
                ratios.append(on["eps"] / off["eps"])
                cpu_ratios.append(off["cpu_s"] / on["cpu_s"])
                alone = {spans: runtime_child(n, spans) for spans in order}  # the runtime alone: recording only
                runtime_ratios.append(alone[True][1] / alone[False][1])
                print(f"  {n:,} episodes, pair {pair + 1}: spans on {on['eps']:,.0f} ep/s ({on['cpu_s']:.1f} CPU s), "
                      f"off {off['eps']:,.0f} ep/s ({off['cpu_s']:.1f} CPU s): on/off {ratios[-1]:.3f}, CPU "
                      f"{cpu_ratios[-1]:.3f}; the runtime alone, per CPU-second: on/off {runtime_ratios[-1]:.3f}; "
                      f"{machine_line()}", flush=True)
            good = statistics.median(cpu_ratios) >= GOAL_SPANS or statistics.median(ratios) >= GOAL_SPANS
            ok = ok and good
            print(f"{n:,} episodes: spans on/off episodes/s {spread(ratios)}, per CPU-second {spread(cpu_ratios)} "
                  f"(goal >= {GOAL_SPANS:g}: {'ok' if good else 'OVER THE 5% BUDGET'}); the runtime alone (recording "
                  f"only, no store and no report), per CPU-second: {spread(runtime_ratios)}")
    print(machine_line() + " (at the end)")
    return 0 if ok else 1


def instructions(episodes: int, root: Path, spans: bool, timeout: float) -> subprocess.Popen:
    """Start one `scaffold run` under callgrind (its count goes to the process's stderr)."""
    import yaml

    tag = f"{episodes}-{int(spans)}"
    config = root / f"count-{tag}.yaml"
    config.write_text(yaml.safe_dump(config_data(episodes, 1, True, spans)), encoding="utf-8")
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *scaffold_command(), "run",
           str(config), "-o", str(root / f"count-out-{tag}")]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env_with_test_plugin())


def counted(proc: subprocess.Popen, timeout: float) -> int:
    _, err = proc.communicate(timeout=timeout)
    found = [line for line in err.splitlines() if "Collected :" in line]
    if proc.returncode != 0 or not found:
        raise SystemExit(f"a counted run failed ({proc.returncode}):\n{err[-3000:]}")
    return int(found[-1].split(":")[-1].replace(",", "").strip())


def spans_instructions(args: argparse.Namespace) -> int:
    """``--spans --instructions``: instructions of the command, spans on and off, at each size."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    print(f"the cost of recording spans, counted: scaffold run under valgrind's callgrind, spans on and off side "
          f"by side; sizes {', '.join(f'{n:,}' for n in args.sizes)}")
    print(machine_line())
    counts: dict[int, dict[bool, int]] = {}
    with tempfile.TemporaryDirectory(prefix="scaffold-e2e-", dir=args.dir) as tmp:
        run_cli(200, 1, Path(tmp), args.timeout)  # the bytecode cache
        for n in args.sizes:
            procs = {spans: instructions(n, Path(tmp), spans, args.timeout) for spans in (True, False)}
            counts[n] = {spans: counted(proc, args.timeout) for spans, proc in procs.items()}
            on, off = counts[n][True], counts[n][False]
            print(f"  {n:,} episodes: instructions spans on {on / 1e9:.3f} G, off {off / 1e9:.3f} G: off/on "
                  f"{off / on:.3f} (goal >= {GOAL_SPANS:g})", flush=True)
    sizes = sorted(counts)
    ok = all(counts[n][False] / counts[n][True] >= GOAL_SPANS for n in sizes)
    if len(sizes) >= 2:
        low, high = sizes[0], sizes[-1]
        per = {spans: (counts[high][spans] - counts[low][spans]) / (high - low) for spans in (True, False)}
        print(f"each further episode ({low:,} to {high:,}): spans on {per[True] / 1e3:,.0f} k instructions, off "
              f"{per[False] / 1e3:,.0f} k: off/on {per[False] / per[True]:.3f}")
    print(machine_line() + " (at the end)")
    return 0 if ok else 1


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
    p.add_argument("--spans", action="store_true",
                   help="measure the cost of recording spans (output.spans on and off, alternately) instead")
    p.add_argument("--instructions", action="store_true",
                   help="with --spans: count instructions under valgrind's callgrind instead of timing")
    p.add_argument("--runtime-only", type=int, help=argparse.SUPPRESS)  # the child of runtime_child
    p.add_argument("--runtime-no-spans", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.spans:
        return spans_instructions(args) if args.instructions else spans_cost(args)
    if args.runtime_only:
        print(json.dumps(runtime_only(args.runtime_only, not args.runtime_no_spans)))
        return 0
    print(f"scaffold run end to end: benchmark_canned engine, arithmetic task, native controller, ~1,000 "
          f"byte tokens per sample; sizes {', '.join(f'{n:,}' for n in args.sizes)}; repeat {args.repeat}"
          + ("; without the trajectories dataset" if args.no_dataset else ""))
    print(machine_line())
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaffold-e2e-", dir=args.dir) as tmp:
        run_cli(200, 1, Path(tmp), args.timeout)  # a first run: the bytecode cache is written, as by a user's first
        for workers in args.workers:
            for n in args.sizes:
                runs = []
                for _ in range(args.repeat):
                    before = runtime_child(min(20_000, n))
                    run = run_cli(n, workers, Path(tmp), args.timeout, not args.no_dataset)
                    after = runtime_child(min(20_000, n))
                    base, base_cpu = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
                    run.update(ratio=run["eps"] / base, cpu_ratio=n / run["cpu_s"] / base_cpu, base=base)
                    runs.append(run)
                    print(f"  {n:,} episodes, {workers} worker(s): runtime alone {before[0]:,.0f} and {after[0]:,.0f} "
                          f"ep/s (before and after), scaffold run "
                          f"{run['eps']:,.0f} ep/s ({run['cpu_s']:.1f} CPU s, {run['peak_rss_mb']:.0f} MB): "
                          f"ratio {run['ratio']:.2f}, CPU ratio {run['cpu_ratio']:.2f}", flush=True)
                rows.append((n, workers, runs))
    print(machine_line() + " (at the end)")
    print(f"{'episodes':>10} {'workers':>7} {'wall s':>7} {'episodes/s':>10} {'ratio to runtime (goal 0.5)':>28} "
          f"{'CPU ratio':>17} {'peak RSS MB':>11} {'bytes/episode':>13} {'x dataset (goal 1.5)':>21}")
    for n, workers, runs in rows:
        ratio = statistics.median(r["ratio"] for r in runs)
        rss = max(r["peak_rss_mb"] for r in runs)
        size = statistics.median(r["bytes_ratio"] for r in runs)
        ok = ratio >= GOAL_RATIO and rss <= GOAL_RSS_MB and (args.no_dataset or size <= GOAL_BYTES)
        print(f"{n:>10,} {workers:>7} {statistics.median(r['wall_s'] for r in runs):>7.1f} "
              f"{statistics.median(r['eps'] for r in runs):>10,.0f} {spread([r['ratio'] for r in runs]):>28} "
              f"{spread([r['cpu_ratio'] for r in runs]):>17} {rss:>11.0f} "
              f"{statistics.median(r['bytes_per_episode'] for r in runs):>13,.0f} "
              f"{'-' if args.no_dataset else f'{size:.2f}':>21}  {'ok' if ok else 'BELOW GOAL'}")
    print("ratio: the command's episodes/s over the runtime's alone, measured just before and after it (median, and "
          "the lowest and highest of the repeats); CPU ratio: the same for episodes per CPU-second (the command's "
          "own and its workers'), steadier on a shared machine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
