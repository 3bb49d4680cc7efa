"""Where a decode step of the embedded engine spends its time: torch.profiler over decode steps.

Runs ``--steps`` decode steps of ``--batch`` sequences of SmolLM2-135M through the engine's lean forward and
through transformers' forward (``lean_forward: false``), and prints, for each, the wall time per step, the
number of operator calls per step, and the operators with the most self CPU time. What it showed before
the lean forward existed: a batch-1 step ran ~1,500 operator calls, and their dispatch cost more than the
matrix products.

    python bench/engine_profile.py [--batch 1] [--steps 32] [--top 12]
"""

from __future__ import annotations

import argparse
import asyncio
import os


async def profile(lean: bool, batch: int, steps: int, top: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from scaffold_core.generation import GenerationRequest
    from scaffold_core.sampling import SamplingParams
    from scaffold_core.tokenizers import render_chat
    from scaffold_transformers.transformers_engine import TransformersEngine

    engine = TransformersEngine(max_batch_size=batch, batch_wait_ms=50, lean_forward=lean, prefix_cache_mb=0)
    await engine.start()
    prompt = render_chat(engine.tokenizer, [{"role": "user", "content": "Tell me a long story."}])[1]

    async def run() -> None:
        sampling = SamplingParams(max_tokens=steps, temperature=1.0)
        await asyncio.gather(*(engine.generate(GenerationRequest(f"r{i}", prompt, sampling, seed=i))
                               for i in range(batch)))

    await run()  # warm-up
    before = engine.stats()["decode_steps"]
    # the decode loop runs on the engine's worker thread, and the profiler records the thread that starts it:
    # started and stopped there (the worker runs one job at a time, so the batch runs in between)
    prof = torch_profile(activities=[ProfilerActivity.CPU])
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(engine._executor, prof.start)
    await run()
    await loop.run_in_executor(engine._executor, prof.stop)
    done = engine.stats()["decode_steps"] - before
    events = prof.key_averages()
    calls = sum(e.count for e in events if not e.key.startswith("ProfilerStep"))
    total_ms = sum(e.self_cpu_time_total for e in events) / 1000
    print(f"\n{'lean forward' if lean else 'transformers forward'}, batch {batch}: {done} decode steps, "
          f"{total_ms / max(done, 1):.1f} ms of operator CPU time and {calls / max(done, 1):.0f} operator calls "
          f"per step (load {os.getloadavg()[0]:.2f})")
    print(events.table(sort_by="self_cpu_time_total", row_limit=top))
    await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    for lean in (False, True):
        asyncio.run(profile(lean, args.batch, args.steps, args.top))


if __name__ == "__main__":
    main()
