"""Do two checkouts of scaffold write the same run outputs? Runs small configs with each and compares content.

    python bench/compare_outputs.py --baseline /path/to/other/checkout     # e.g. a worktree of main
    python bench/compare_outputs.py --compare DIR_A DIR_B [--baseline CHECKOUT_OF_A]  # two output folders

Each config runs with ``scaffold run`` on the benchmark_canned engine, once
with the baseline checkout first on ``PYTHONPATH`` and once with this one
(each in a folder of its own, so that the current directory's checkout does
not shadow the baseline). Compared, in content: every episode's record as the
checkout that wrote it reads it back (``scaffold_core.output.read_records``
from the run's store; ``read_ledger`` over the ledgers of versions before it),
token arrays as lists, ordered by episode id (``wall_s`` left out, it is a
clock reading),
``samples.jsonl`` and ``failures.jsonl`` line by line, every row and the
features of the ``trajectories`` dataset, and ``metrics.json`` without the
session's clock readings (wall time, throughput, the output folder). Also
printed: the bytes each writes per episode, and their ratio to the dataset's.
Exits 1 on any difference, naming it.
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
    env["SCAFFOLD_EXTRA_PLUGINS"] = "scaffold_testkit.plugin"
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "run", str(path), "-o", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=out.parent)
    if proc.returncode not in (0, 1, 3, 4):  # finished (1, 3, 4: with failed episodes, depending on the version)
        raise SystemExit(f"scaffold run failed ({proc.returncode}) for {out}:\n{proc.stderr[-3000:]}")


#: Prints a run's records as JSON, read by the checkout first on the path (a version with the run's store, or
#: one with its ledger).
READ_RECORDS = """
import json, sys
try:
    from scaffold_core.output import read_records
    records = list(read_records(sys.argv[1]))
except ImportError:
    from scaffold_core.output import ledger_paths, read_ledger
    records = [record for path in ledger_paths(sys.argv[1]) for record in read_ledger(path)]
json.dump(records, sys.stdout, default=str)
"""


def ledger(out: Path, pythonpath: str | None = None) -> list[dict[str, Any]]:
    """Every record of the run in ``out``, as the checkout at ``pythonpath`` (default: this one) reads it."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", READ_RECORDS, str(out)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=out.parent)
    if proc.returncode != 0:
        raise SystemExit(f"reading the records of {out} failed:\n{proc.stderr[-3000:]}")
    records = json.loads(proc.stdout)
    for record in records:
        record.pop("wall_s", None)
    return sorted(records, key=lambda r: (r["episode_id"], json.dumps(r, sort_keys=True, default=str)))


def sizes(out: Path) -> tuple[int, int]:
    """(bytes of every file the run wrote, bytes of its trajectories dataset)."""
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    dataset = sum(p.stat().st_size for p in (out / "trajectories").rglob("*") if p.is_file())
    return total, dataset


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


def compare(a: Path, b: Path, reader_a: str | None = None) -> list[str]:
    """What differs between the runs in ``a`` and ``b`` (``reader_a``: the checkout that reads ``a``'s records)."""
    problems = []
    for name, read in (("records", lambda o: ledger(o, reader_a if o == a else None)),
                       ("samples.jsonl", lambda o: lines(o / "samples.jsonl")),
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
        problems = compare(Path(args.compare[0]), Path(args.compare[1]), args.baseline)
    elif args.baseline:
        problems = []
        with tempfile.TemporaryDirectory(prefix="scaffold-compare-") as tmp:
            for name, config in CONFIGS.items():
                base, new = Path(tmp) / f"{name}-baseline", Path(tmp) / f"{name}-this"
                run(config, base, args.baseline, args.workers)
                run(config, new, None, args.workers)
                found = compare(base, new, args.baseline)
                counts = {f: sum(1 for _ in (new / f).open()) for f in ("samples.jsonl", "failures.jsonl")}
                features, rows = dataset(new)
                records = len(ledger(new))
                (base_total, base_data), (new_total, new_data) = sizes(base), sizes(new)
                print(f"{name}: {records} records, {counts['samples.jsonl']} samples, "
                      f"{counts['failures.jsonl']} failures, "
                      f"{'a dataset that does not load (no rows)' if features == 'cannot load' else len(rows)}"
                      " dataset rows: "
                      f"{'same content' if not found else 'DIFFERENT'}; bytes per episode {base_total / records:,.0f}"
                      f" -> {new_total / records:,.0f} ({base_total / max(base_data, 1):.2f}x -> "
                      f"{new_total / max(new_data, 1):.2f}x the dataset)")
                problems += found
    else:
        p.error("give --baseline or --compare")
    for problem in problems:
        print(problem)
    print("outputs identical in content" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
