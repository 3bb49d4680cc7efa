"""`make bench`: run every benchmark script and print the measured figures.

Each script runs in its own process; a failing one is reported and the rest still run.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = [
    ("CLI start-up (issue 2)", "cli_startup.py", []),
    ("runtime overhead (issue 3)", "runtime_overhead.py", []),
    ("model load (issue 3)", "model_load.py", []),
    ("batching efficiency (issue 3)", "batching_efficiency.py", []),
    ("GSM8K verifier (issue 4)", "gsm8k_verifier.py", []),
    ("SGLang client (issue 5)", "sglang_client.py", []),
    ("multi-turn drift and speed (issue 6)", "multiturn_drift.py", []),
    ("multi-worker speed-up (issue 7)", "multiworker.py", []),
    ("port contention (issue 7)", "ports.py", []),
]


def main() -> int:
    failed = 0
    for title, script, args in SCRIPTS:
        path = HERE / script
        print(f"\n== {title}: bench/{script}", flush=True)
        if not path.exists():
            print("   (not present in this checkout)")
            continue
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(path), *args], timeout=3600)
        print(f"   [{time.perf_counter() - start:.0f} s]", flush=True)
        failed += proc.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
