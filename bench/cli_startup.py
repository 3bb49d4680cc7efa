"""Start-up time of `scaffold list-plugins` next to a bare `python -c pass` (median of several runs).

Target: <= 0.5 s with all plugins installed, and no torch/transformers/sglang imported.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

RUNS = 11


def median_wall(cmd: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    scaffold = shutil.which("scaffold") or str(__import__("pathlib").Path(sys.executable).parent / "scaffold")
    bare = median_wall([sys.executable, "-c", "pass"])
    listing = median_wall([scaffold, "list-plugins"])
    plugins = subprocess.run([scaffold, "list-plugins", "--json"], capture_output=True, text=True, check=True).stdout
    n = plugins.count('"status"')
    print(f"cli start-up (median of {RUNS}): python -c pass {bare:.3f} s; scaffold list-plugins {listing:.3f} s "
          f"({n} plugins installed); target <= 0.5 s  {'ok' if listing <= 0.5 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
