"""``examples/multiturn-gsm8k.yaml`` end to end: this tree against an earlier commit, side by side.

The earlier commit's tree is extracted with ``git archive`` into a temporary folder and run with this
tree's virtual environment, its packages first on ``PYTHONPATH`` (the same libraries, the older scaffold).
The two commands run alternately, ``--repeat`` times each, on the same config and the same seed, so a
change of the machine's load hits both alike. Each run is the real command line (``scaffold run CONFIG
-o DIR --no-report``): start-up, model load, the episodes, the files. Reported per run: wall time, the
CPU time the child used (user + system: less sensitive to the load than wall time, since a starved
process waits without using CPU), the load average before it, and the run's own ``metrics.json`` figures
(rollout wall time, generated tokens, turns). The ratios are medians of old over new.

    python bench/multiturn_example.py --baseline 2b69083^ [--limit 4] [--repeat 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "multiturn-gsm8k.yaml"


def extract(ref: str, into: Path) -> Path:
    """The tree of commit ``ref``, written under ``into``."""
    tree = into / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True,
                             timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True, timeout=120)
    return tree


def command(tree: Path | None, config: Path, out: Path, sets: list[str]) -> tuple[list[str], dict[str, str]]:
    """The ``scaffold run`` command line, and its environment (the baseline's packages first on the path)."""
    env = dict(os.environ)
    if tree is not None:
        paths = [str(tree)] + [str(p) for p in sorted((tree / "plugins").iterdir()) if p.is_dir()]
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # A tree from before the default plugins had them built into its core: the installed default plugins would
        # register the same names again (their entry points stay in this venv), so the baseline leaves them out.
        if (tree / "scaffold_core" / "engines" / "transformers_engine.py").exists():
            env["SCAFFOLD_DISABLE_PLUGINS"] = "transformers,datasets,report"
    # what the installed `scaffold` command runs: console() where the tree has it (main() before)
    entry = "import sys, scaffold_core.cli as cli; sys.exit(getattr(cli, 'console', cli.main)())"
    args = [sys.executable, "-c", entry,
            "run", str(config), "-o", str(out), "--no-report", "--no-progress", "--overwrite"]
    for item in sets:
        args += ["--set", item]
    return args, env


def run_once(tree: Path | None, config: Path, out: Path, sets: list[str], timeout: float) -> dict:
    args, env = command(tree, config, out, sets)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=tree if tree is not None else ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "load": load, "rollout_s": metrics.get("wall_s"),
            "tokens": metrics.get("generated_tokens"), "turns": metrics.get("turns"),
            "engine": metrics.get("engine", {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--limit", type=int, default=None, help="task.limit for both (default: the config's)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE for both runs")
    parser.add_argument("--this-first", action="store_true", help="start with this tree (default: the baseline)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    args = parser.parse_args()
    sets = list(args.sets) + ([f"task.limit={args.limit}"] if args.limit is not None else [])
    print(f"machine: {os.cpu_count()} CPUs; config {args.config.name} {' '.join(sets)}; baseline {args.baseline}")
    with tempfile.TemporaryDirectory(prefix="scaffold-multiturn-bench-") as tmp:
        tmp_path = Path(tmp)
        tree = extract(args.baseline, tmp_path)
        config = args.config.resolve()
        runs: dict[str, list[dict]] = {"baseline": [], "this tree": []}
        for i in range(args.repeat):
            order: list[tuple[str, Path | None]] = [("baseline", tree), ("this tree", None)]
            if (i % 2 == 1) != args.this_first:
                order.reverse()
            for name, where in order:
                out = tmp_path / f"run-{name.replace(' ', '-')}-{i}"
                r = run_once(where, config, out, sets, args.timeout)
                shutil.rmtree(out, ignore_errors=True)
                runs[name].append(r)
                e = r["engine"]
                print(f"  {name:9s} run {i + 1}: wall {r['wall_s']:7.1f} s  cpu {r['cpu_s']:7.1f} s  "
                      f"rollout {r['rollout_s']} s  tokens {r['tokens']}  turns {r['turns']}  "
                      f"load before {r['load']:.2f}  (engine: batches {e.get('batches')}, "
                      f"mean batch {e.get('mean_batch')}, prefill {e.get('prefill_s')} s)", flush=True)
        for key in ("wall_s", "cpu_s", "rollout_s"):
            old = statistics.median(r[key] for r in runs["baseline"])
            new = statistics.median(r[key] for r in runs["this tree"])
            print(f"{key}: baseline {old:.1f}, this tree {new:.1f}: {old / new:.2f}x")
    one, five, fifteen = os.getloadavg()
    print(f"load average at the end {one:.2f} / {five:.2f} / {fifteen:.2f}")


if __name__ == "__main__":
    main()
