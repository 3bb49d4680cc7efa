"""Group prefill sharing in the embedded engine: majority vote x8 on SmolLM2-135M, short and long prompts.

Each episode samples 8 answers to one prompt; its 8 requests arrive together
and share a batch. Without sharing (``share_prefill: false``, the engine's
behaviour before sharing existed) every sample pre-fills the same prompt
again; with it the prompt is pre-filled once per group and its KV cache
copied to the 8 rows. Both modes run the same seeded requests, alternately,
``--repeat`` times each; the medians are reported, with the engine's own
prefill time (``stats()['prefill_s']``), and the two modes' outputs are
compared (same tokens, logprobs within 1e-4).

    python bench/group_prefill.py [--episodes 4] [--max-tokens 16] [--long-tokens 512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SCAFFOLD_GSM8K_DATA", ROOT.parent / "shared" / "data" / "gsm8k")) / "test.jsonl"
SAMPLES = 8


def rows(n: int) -> list[dict]:
    """GSM8K test rows, or (without the data) as many distinct made-up ones."""
    if DATA.exists():
        with DATA.open() as f:
            return [json.loads(next(f)) for _ in range(n)]
    return [{"question": f"Natalia sold clips to {2 * k} of her friends in April, and then she sold half as many "
                         "clips in May. How many clips did Natalia sell altogether in April and May?",
             "answer": f"Natalia sold {2 * k}/2 = {k} clips in May.\nNatalia sold {2 * k}+{k} = {3 * k} clips "
                       f"altogether.\n#### {3 * k}"} for k in range(24, 24 + n)]


def machine() -> str:
    one, five, fifteen = os.getloadavg()
    return (f"machine: {os.cpu_count()} CPUs, torch threads {torch_threads()}; "
            f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min)")


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def build_prompts(tokenizer, episodes: int, long_tokens: int) -> dict[str, list[list[int]]]:
    """Short: one question. Long: few-shot worked examples before the question, about ``long_tokens`` tokens."""
    from scaffold_core.tokenizers import render_chat

    system = {"role": "system", "content": "Solve step by step. End with '#### <answer>'."}
    questions = rows(episodes)
    shots = rows(episodes + 40)[episodes:]
    short = [render_chat(tokenizer, [system, {"role": "user", "content": q["question"]}])[1] for q in questions]
    long = []
    for q in questions:
        messages = [system]
        for shot in shots:
            messages += [{"role": "user", "content": shot["question"]},
                         {"role": "assistant", "content": shot["answer"]}]
            if len(render_chat(tokenizer, messages)[1]) >= long_tokens:
                break
        long.append(render_chat(tokenizer, [*messages, {"role": "user", "content": q["question"]}])[1])
    return {"short": short, "long": long}


async def one_run(engine, prompts: list[list[int]], max_tokens: int, share: bool) -> dict:
    from scaffold_core.builtins.controllers import MajorityVoteController
    from scaffold_core.builtins.verifiers import ExactMatchVerifier
    from scaffold_core.episode import EpisodeContext
    from scaffold_core.run.assembly import Limits
    from scaffold_core.run.runtime import Runtime
    from scaffold_core.run.verifier_pool import VerifierPool
    from scaffold_core.sampling import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0)
    contexts = [EpisodeContext(episode_id=f"e{i}", index=i, row={}, prompt_ids=p, sampling=sampling, seed=1000 + i,
                               reference="#### 0") for i, p in enumerate(prompts)]
    samples: dict[tuple[str, int], tuple[list[int], list[float]]] = {}

    def on_result(result):
        assert result.ok, result.error
        for s in result.samples:
            samples[(result.episode_id, s.sample_index)] = (s.output_ids, s.output_logprobs)

    engine.share_prefill = share
    pool = VerifierPool(ExactMatchVerifier(), timeout=60, workers=1)
    runtime = Runtime(engine=engine, controller=MajorityVoteController(samples=SAMPLES), verifier=pool,
                      limits=Limits(concurrency=len(prompts)))
    before = engine.stats()
    start, cpu = time.perf_counter(), time.process_time()
    try:
        await runtime.run(contexts, on_result)
    finally:
        pool.close()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    after = engine.stats()
    tokens = sum(len(ids) for ids, _ in samples.values())
    return {"wall_s": wall, "cpu_s": cpu, "tokens_per_s": tokens / wall, "tokens": tokens, "samples": samples,
            "prefill_s": after["prefill_s"] - before["prefill_s"], "prefills": after["prefills"] - before["prefills"],
            "batches": after["batches"] - before["batches"]}


def prefill_alone(engine, prompts: list[list[int]], share: bool) -> dict:
    """One batch's prefill by itself: each prompt for its group's ``SAMPLES`` rows (wall and process CPU s)."""
    import torch

    from scaffold_transformers.prefill import prefill

    rows = [p for p in prompts for _ in range(SAMPLES)]
    device = next(engine.model.parameters()).device
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        prefill(torch, engine.model, rows, pad_id=engine.pad_id, device=device, cache_arg=engine._cache_arg,
                share=share)
    return {"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}


def report_alone(runs: dict[bool, list[dict]], rows: int) -> None:
    today, now = ({k: statistics.median(r[k] for r in runs[share]) for k in ("wall_s", "cpu_s")}
                  for share in (False, True))
    print(f"    prefill alone ({rows} rows): today {today['wall_s']:.3f} s wall / {today['cpu_s']:.3f} s CPU, "
          f"now {now['wall_s']:.3f} s / {now['cpu_s']:.3f} s (ratio {today['wall_s'] / now['wall_s']:.2f}x / "
          f"{today['cpu_s'] / now['cpu_s']:.2f}x less); all wall today "
          f"{[round(r['wall_s'], 3) for r in runs[False]]}, now {[round(r['wall_s'], 3) for r in runs[True]]}")


def report(title: str, runs: dict[bool, list[dict]], groups: int) -> None:
    keys = ("tokens_per_s", "prefill_s", "wall_s", "cpu_s")
    today, now = ({k: statistics.median(r[k] for r in runs[share]) for k in keys} for share in (False, True))
    prefills = runs[False][0]["prefills"], runs[True][0]["prefills"]
    print(f"  {title}: prefills per run today {prefills[0]}, goal {groups} (one per group), now {prefills[1]}  "
          f"{'met' if prefills[1] == groups else 'NOT met'}")
    every = {share: [round(r["prefill_s"], 3) for r in runs[share]] for share in (False, True)}
    print(f"    prefill time in the runs: today {today['prefill_s']:.3f} s, now {now['prefill_s']:.3f} s "
          f"(ratio {today['prefill_s'] / max(now['prefill_s'], 1e-9):.2f}x less); all today {every[False]}, "
          f"now {every[True]}")
    print(f"    tokens/s: today {today['tokens_per_s']:.1f}, now {now['tokens_per_s']:.1f} "
          f"(ratio {now['tokens_per_s'] / today['tokens_per_s']:.2f}x); wall today {today['wall_s']:.2f} s, "
          f"now {now['wall_s']:.2f} s; process CPU today {today['cpu_s']:.2f} s, now {now['cpu_s']:.2f} s "
          f"(ratio {today['cpu_s'] / now['cpu_s']:.2f}x less); batches per run {runs[True][0]['batches']}")
    same, worst = compare(runs[False][0]["samples"], runs[True][0]["samples"])
    print(f"    same tokens in both modes: {'yes' if same else 'NO'}; max |logprob delta| {worst:.2e} "
          f"(goal <= 1e-4)  {'met' if same and worst <= 1e-4 else 'NOT met'}")


def compare(a: dict, b: dict) -> tuple[bool, float]:
    same = a.keys() == b.keys() and all(a[k][0] == b[k][0] for k in a)
    worst = max((abs(x - y) for k in a if k in b for x, y in zip(a[k][1], b[k][1])), default=0.0)
    return same, worst


async def main_async(args) -> None:
    from scaffold_transformers.transformers_engine import TransformersEngine

    engine = TransformersEngine(max_batch_size=args.episodes * SAMPLES, batch_wait_ms=20, threads=args.threads)
    await engine.start()
    try:
        sets = build_prompts(engine.tokenizer, args.episodes, args.long_tokens)
        await one_run(engine, sets["short"][:1], 2, True)  # warm-up
        print(machine())
        print(f"group prefill: majority_vote x{SAMPLES}, {args.episodes} episodes ({args.episodes * SAMPLES} "
              f"requests in one batch), max_tokens {args.max_tokens}, T=1.0, SmolLM2-135M fp32 on CPU, "
              f"{args.repeat} runs per mode (medians)")
        for name, prompts in sets.items():
            runs: dict[bool, list[dict]] = {False: [], True: []}
            alone: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(args.repeat):
                for share in (False, True):
                    alone[share].append(prefill_alone(engine, prompts, share))
                    runs[share].append(await one_run(engine, prompts, args.max_tokens, share))
            report(f"{name} prompts (~{statistics.mean(len(p) for p in prompts):.0f} tokens)", runs, args.episodes)
            report_alone(alone, len(prompts) * SAMPLES)
        print(machine())
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4, help="groups per run; all their requests share a batch")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--long-tokens", type=int, default=512, help="length of the long (few-shot) prompts")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
