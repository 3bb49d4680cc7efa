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
    ("CLI start-up", "cli_startup.py", []),
    ("runtime overhead", "runtime_overhead.py", []),
    ("model load", "model_load.py", []),
    ("batching efficiency", "batching_efficiency.py", []),
    ("group prefill sharing", "group_prefill.py", []),
    ("GSM8K verifier", "gsm8k_verifier.py", []),
    ("server engines' client (SGLang, vLLM)", "remote_client.py", []),
    ("multi-turn drift and speed", "multiturn_drift.py", []),
    ("agent overhead", "agent_overhead.py", []),
    ("scaffold serve overhead", "serve_overhead.py", []),
    ("python tool cold start", "tools_python_cold_start.py", []),
    ("multi-worker speed-up", "multiworker.py", []),
    ("scaffold run end to end", "run_end_to_end.py", ["--sizes", "10000", "100000"]),
    ("task loading with a limit", "task_loading.py", []),
    ("port contention", "ports.py", []),
    ("GRPO with TRL on scaffold rollouts", "train_trl.py", []),
    ("report of a 1,319 x 8 eval: size and build time", "report_size.py", []),
    ("inference-time scaling methods", "scaling_methods.py", []),
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
