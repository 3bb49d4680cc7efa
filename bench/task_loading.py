"""Task loading: the gsm8k task with ``limit`` from a large JSON-lines file takes time proportional to the rows used.

    python bench/task_loading.py [--rows 200000] [--limit 5000]

Writes a synthetic file of GSM8K-format rows (question, worked answer ending
in ``#### N``) at bench time, then times ``GSM8KTask(data_files=..., limit=...).load()``
in a fresh process: once with an empty ``datasets`` cache (the file is
converted to Arrow, in C++, once) and once with the cache warm, which is
what every later run pays; and once without ``limit`` for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: Before: every row was converted to Python and checked, whatever the limit (200,000 rows, limit 5,000).
BEFORE_S = 7.0

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import datasets  # imported by any file-backed task; timed apart
t1 = time.perf_counter()
from scaffold_gsm8k.task import GSM8KTask
limit = None if sys.argv[2] == "none" else int(sys.argv[2])
task = GSM8KTask(data_files=sys.argv[1], limit=limit, cache_dir=sys.argv[3])
t2 = time.perf_counter()
rows = task.load()
t3 = time.perf_counter()
print(json.dumps({"import_datasets_s": t1 - t0, "load_s": t3 - t2, "rows": len(rows)}))
"""


def machine_line() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return f"machine: {cores} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def write_rows(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            a, b = i % 97 + 3, i % 89 + 5
            fh.write(json.dumps({
                "question": f"A shop sells {a} apples in the morning and {b} in the afternoon. How many in all?",
                "answer": f"In the morning {a}, in the afternoon {b}, so {a} + {b} = <<{a}+{b}={a + b}>>{a + b}.\n"
                          f"#### {a + b}"}) + "\n")


def load(path: Path, limit: int | None, cache: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(limit or "none"), str(cache)],
                         capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--limit", type=int, default=5_000)
    args = p.parse_args()
    print(f"task loading: gsm8k task, {args.rows:,}-row JSON-lines file, limit {args.limit:,}; {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="scaffold-bench-") as tmp:
        path = Path(tmp) / "rows.jsonl"
        write_rows(path, args.rows)
        cache = Path(tmp) / "cache"
        cold = load(path, args.limit, cache)
        warm = load(path, args.limit, cache)
        everything = load(path, None, cache)
    print(f"{'load':<38}{'seconds':>9}{'rows':>9}")
    print(f"{'limit, empty datasets cache':<38}{cold['load_s']:>9.2f}{cold['rows']:>9,}")
    print(f"{'limit, warm cache (every later run)':<38}{warm['load_s']:>9.2f}{warm['rows']:>9,}")
    print(f"{'no limit, warm cache':<38}{everything['load_s']:>9.2f}{everything['rows']:>9,}")
    print(f"importing datasets (paid by any file-backed task): {warm['import_datasets_s']:.2f} s")
    ratio = everything["load_s"] / max(warm["load_s"], 1e-9)
    print(f"with limit {args.limit:,} of {args.rows:,} rows: {warm['load_s']:.2f} s (before ~{BEFORE_S:.0f} s; goal: "
          f"proportional to the rows used); all rows take {ratio:.0f}x as long")
    print(machine_line() + " (at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
