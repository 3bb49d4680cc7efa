"""Do two checkouts of scaffold write the same run outputs? Runs small configs with each and compares content.

    python bench/compare_outputs.py --baseline /path/to/other/checkout     # e.g. a worktree of main
    python bench/compare_outputs.py --compare DIR_A DIR_B                  # two existing output folders

Each config runs with ``scaffold run`` on the benchmark_canned engine, once
with the baseline checkout first on ``PYTHONPATH`` and once with this one.
Compared, in content: every ledger record (ordered by episode id; ``wall_s``
left out, it is a clock reading), ``samples.jsonl`` and ``failures.jsonl``
line by line, every row and the features of the ``trajectories`` dataset,
and ``metrics.json`` without the session's clock readings (wall time,
throughput, the output folder). Exits 1 on any difference, naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CLOCK_KEYS = {"wall_s", "tokens_per_s", "episodes_per_s", "output_dir"}

CONFIGS: dict[str, dict[str, Any]] = {
    "native": {
        "task": {"name": "arithmetic", "count": 300, "system": "Think step by step."},
        "engine": {"name": "benchmark_canned", "response": "Seventeen and twenty-five.\n#### 42"},
        "sampling": {"max_tokens": 64},
    },
    "majority_vote_grpo": {
        "task": {"name": "arithmetic", "count": 120},
        "engine": {"name": "benchmark_canned", "response": "so it is #### 42", "logprob": -0.1234567},
        "controller": {"name": "majority_vote", "samples": 4},
        "trajectory": {"name": "grpo"},
        "sampling": {"max_tokens": 8},
    },
    "best_of_n_truncated": {
        "task": {"name": "arithmetic", "count": 80},
        "engine": {"name": "benchmark_canned", "response": "a long answer that is cut"},
        "controller": {"name": "best_of_n", "samples": 3},
        "sampling": {"max_tokens": 5},
    },
    "long_sequences": {  # the end-to-end benchmark's episodes: ~1,000 byte tokens per sample
        "task": {"name": "arithmetic", "count": 2000, "system": "Solve it step by step, carefully. " * 12},
        "engine": {"name": "benchmark_canned",
                   "response": "I add the tens, then the ones, and carry. " * 11 + "#### 42"},
        "sampling": {"max_tokens": 512},
    },
    "all_failed": {
        "task": {"name": "arithmetic", "count": 20},
        "engine": {"name": "benchmark_canned", "delay_s": 0.2},
        "rollout": {"request_timeout": 0.01},
    },
}


def run(config: dict[str, Any], out: Path, pythonpath: str | None, workers: int = 1) -> None:
    data = json.loads(json.dumps(config))
    data.setdefault("rollout", {}).update({"progress": False, "workers": workers})
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    env = dict(os.environ)
    env["SCAFFOLD_EXTRA_PLUGINS"] = "scaffold_core.testing.plugin"
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "run", str(path), "-o", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 1, 3, 4):  # finished (1, 3, 4: with failed episodes, depending on the version)
        raise SystemExit(f"scaffold run failed ({proc.returncode}) for {out}:\n{proc.stderr[-3000:]}")


def ledger(out: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(out.glob("episodes*.jsonl")):
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                record = json.loads(line)
                record.pop("wall_s", None)
                records.append(record)
    return sorted(records, key=lambda r: (r["episode_id"], json.dumps(r, sort_keys=True)))


def lines(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def dataset(out: Path) -> tuple[Any, list[dict[str, Any]]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(out / "trajectories"))
    except Exception as exc:  # a run without a single training row writes a dataset that does not load
        return "cannot load", [{"error": type(exc).__name__}]
    return ds.features.to_dict(), ds.to_list()


def metrics(out: Path) -> dict[str, Any]:
    data = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    if "workers" in data:  # per-worker clock readings
        data["workers"] = {"count": data["workers"].get("count"),
                           "per_worker": [{k: v for k, v in w.items() if k not in CLOCK_KEYS}
                                          for w in data["workers"].get("per_worker", [])]}
    return {k: v for k, v in data.items() if k not in CLOCK_KEYS and k != "session"}


def compare(a: Path, b: Path) -> list[str]:
    problems = []
    for name, read in (("ledger records", ledger), ("samples.jsonl", lambda o: lines(o / "samples.jsonl")),
                       ("failures.jsonl", lambda o: lines(o / "failures.jsonl")),
                       ("trajectories dataset", dataset), ("metrics.json", metrics)):
        left, right = read(a), read(b)
        if left != right:
            where = ""
            if isinstance(left, dict) and isinstance(right, dict):
                keys = sorted(k for k in left.keys() | right.keys() if left.get(k) != right.get(k))
                where = f" (keys {', '.join(keys)})"
            problems.append(f"{name} differ between {a} and {b}{where}")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", help="the other checkout (its folder holds scaffold_core/)")
    p.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), help="compare two existing output folders")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()
    if args.compare:
        problems = compare(Path(args.compare[0]), Path(args.compare[1]))
    elif args.baseline:
        problems = []
        with tempfile.TemporaryDirectory(prefix="scaffold-compare-") as tmp:
            for name, config in CONFIGS.items():
                base, new = Path(tmp) / f"{name}-baseline", Path(tmp) / f"{name}-this"
                run(config, base, args.baseline, args.workers)
                run(config, new, None, args.workers)
                found = compare(base, new)
                counts = {f: sum(1 for _ in (new / f).open()) for f in ("samples.jsonl", "failures.jsonl")}
                features, rows = dataset(new)
                print(f"{name}: {len(ledger(new))} ledger records, {counts['samples.jsonl']} samples, "
                      f"{counts['failures.jsonl']} failures, "
                      f"{'a dataset that does not load (no rows)' if features == 'cannot load' else len(rows)}"
                      " dataset rows: "
                      f"{'same content' if not found else 'DIFFERENT'}")
                problems += found
    else:
        p.error("give --baseline or --compare")
    for problem in problems:
        print(problem)
    print("outputs identical in content" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
