"""Inference-time scaling methods on the bundled SmolLM2-135M: accuracy and generated tokens per method.

Task: ``small_arithmetic`` (one-digit sums, made from ``--seed``), ``--problems`` of them, sampled at
temperature 0.7 with at most ``--max-tokens`` tokens, scored by the ``small_arithmetic`` verifier. Methods,
each a controller run through scaffold's runtime on the embedded engine:

* native: one sample;
* majority@8: the built-in ``majority_vote`` over 8 samples;
* best-of-8 judge: ``rerank`` over 8 samples, the policy judging each one (``judge``, yes/no);
* DeepConf@8 offline (``keep`` 0.9 and 0.1) and online (chosen on seed 1 with ``deepconf_replay.py``: 2
  warm-up traces, ``keep`` 1.0, the sampled tokens' probabilities as confidence, windows of 4 or 5 tokens
  checked every 4 tokens, consensus 0.7 or 0.67), one trace started at a time after the warm-up;
* Dynasor: one trace in chunks of 8 or 12 tokens, probed after each (a reply of at most 4 tokens holds " 12.":
  the tokenizer splits digits);
* tree search: beam search over lines, scored by policy self-evaluation.

Printed per method: accuracy with a 95% Wilson interval, policy and verifier tokens per problem (every
token the engine generated for it: probes, stopped traces and pruned branches included), wall time.
Then the goals from the methods' papers, measured here:

* DeepConf online reaches majority@8's accuracy (within 2 points) with at most 60% of its tokens;
* Dynasor uses at least 25% fewer tokens than native at equal accuracy (within 2 points).

Identical engine requests (the same prompt ids, sampling and seed) are computed once and replayed for
every method that makes them: the engine samples each request from its own seeded generator, so the
replay is exactly what it would generate again (a shorter ``max_tokens`` gets the prefix). Methods
share samples that way (majority@8, best-of-8 and DeepConf offline see the same 8 traces; native is
the first of them), which makes the comparison paired; each method's token count is still its own.
The replay only saves wall time; ``--no-replay`` turns it off.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

#: top logprobs every engine call computes (so a replayed result serves any request that asks for fewer)
TOP_K = 20


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


class ReplayEngine:
    """The embedded engine, each distinct request computed once (see the module docstring)."""

    def __init__(self, engine: Any, replay: bool = True):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.replay = replay
        self.cache: dict[Any, list[Any]] = {}
        self.hits = 0
        self.misses = 0
        self.fresh_tokens = 0
        self.engine_name = "transformers"

    async def start(self) -> None:
        await self.engine.start()
        self.tokenizer = self.engine.tokenizer

    async def close(self) -> None:
        await self.engine.close()

    def _key(self, request: Any) -> Any:
        sp = request.sampling
        return (tuple(request.prompt_ids), sp.temperature, sp.top_p, sp.top_k, sp.stop, sp.stop_token_ids,
                request.seed if sp.temperature > 0 else None)

    async def generate(self, request: Any) -> Any:
        from scaffold_core.generation import GenerationRequest

        want = request.sampling.max_tokens
        key = self._key(request)
        if self.replay:
            for result, limit in self.cache.get(key, []):
                if limit >= want or result.finish_reason == "stop":
                    self.hits += 1
                    return self._cut(result, want, request.sampling.top_logprobs)
        asked = GenerationRequest(request.request_id, request.prompt_ids,
                                  request.sampling.replace(top_logprobs=max(TOP_K, request.sampling.top_logprobs)),
                                  request.seed, request.episode_id)
        result = await self.engine.generate(asked)
        self.misses += 1
        self.fresh_tokens += len(result.output_ids)
        if self.replay:
            self.cache.setdefault(key, []).append((result, want))
        return self._cut(result, want, request.sampling.top_logprobs)

    def _cut(self, result: Any, want: int, top: int) -> Any:
        tops = None if not top or result.top_logprobs is None else [
            dict(sorted(t.items(), key=lambda kv: -kv[1])[:top]) for t in result.top_logprobs[:want]]
        if len(result.output_ids) <= want:
            return replace(result, top_logprobs=tops, meta=dict(result.meta))
        ids = result.output_ids[:want]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        versions = None if result.versions is None else result.versions[:want]
        return replace(result, output_ids=ids, logprobs=result.logprobs[:want], finish_reason="length", text=text,
                       versions=versions, top_logprobs=tops, meta=dict(result.meta))


@dataclass
class Tally:
    name: str
    correct: int = 0
    episodes: int = 0
    failed: int = 0
    policy: float = 0.0
    verifier: float = 0.0
    wall_s: float = 0.0
    per_problem: dict[str, float] = field(default_factory=dict)

    def add(self, result: Any) -> None:
        from scaffold_core.run.metrics import episode_correct

        self.episodes += 1
        if not result.ok:
            self.failed += 1
            print(f"   {self.name}: episode {result.episode_id} failed: {result.error}", file=sys.stderr)
            return
        ok = episode_correct(result) or 0.0
        self.correct += int(ok > 0)
        self.per_problem[result.episode_id] = float(ok > 0)
        metrics = result.metrics
        self.policy += metrics.get("policy_tokens", sum(len(s.output_ids) for s in result.samples))
        self.verifier += metrics.get("verifier_tokens", 0.0)

    @property
    def accuracy(self) -> float:
        return self.correct / self.episodes if self.episodes else math.nan

    def row(self) -> str:
        low, high = wilson(self.correct, self.episodes)
        n = max(1, self.episodes)
        return (f"{self.name:<26} {100 * self.accuracy:6.1f}%  [{100 * low:5.1f}, {100 * high:5.1f}]  "
                f"{self.policy / n:8.1f}  {self.verifier / n:8.1f}  {(self.policy + self.verifier) / n:8.1f}  "
                f"{self.wall_s:7.0f}")


def methods(selected: set[str]) -> list[tuple[str, Any]]:
    from scaffold_core.builtins.controllers import MajorityVoteController, NativeController
    from scaffold_methods.deepconf import DeepConfController
    from scaffold_methods.dynasor import DynasorController
    from scaffold_methods.rerank import RerankController
    from scaffold_methods.tree_search import TreeSearchController

    judge = {"name": "judge", "mode": "yes_no", "system": None}

    def online(**options: Any) -> DeepConfController:
        """DeepConf@8 online as chosen on seed 1 by ``deepconf_replay.py``: 2 warm-up traces, keep 1.0, sampled."""
        return DeepConfController(samples=8, mode="online", keep=1.0, warmup=2, chunk=4, per_round=1,
                                  measure="sampled", **options)
    table = [
        ("majority@8", lambda: MajorityVoteController(samples=8)),
        ("native", lambda: NativeController(samples=1)),
        ("deepconf@8 offline 0.9", lambda: DeepConfController(samples=8, keep=0.9, window=16)),
        ("deepconf@8 offline 0.1", lambda: DeepConfController(samples=8, keep=0.1, window=16)),
        ("best-of-8 judge", lambda: RerankController(samples=8, scorer=judge)),
        ("deepconf@8 online w4 c0.7", lambda: online(window=4, consensus=0.7)),
        ("deepconf@8 online w5 c0.67", lambda: online(window=5, consensus=0.67)),
        ("dynasor chunk 8", lambda: DynasorController(chunk=8, certainty=2, probe_tokens=4)),
        ("dynasor chunk 12", lambda: DynasorController(chunk=12, certainty=2, probe_tokens=4)),
        ("tree search", lambda: TreeSearchController(width=2, expansions=2, depth=3, step_tokens=24, budget=160,
                                                     scorer="self_eval")),
    ]
    return [(name, make) for name, make in table if not selected or name.split()[0].split("@")[0] in selected]


async def run_all(args: argparse.Namespace, table: list[tuple[str, Any]] | None = None,
                  on_result: Any = None) -> list[Tally]:
    """Run ``table`` (default: ``methods(args.methods)``) on the task; ``on_result(name, result)`` sees each episode."""
    from scaffold_core.run.assembly import Limits
    from scaffold_core.run.runtime import Runtime
    from scaffold_core.run.verifier_pool import VerifierPool
    from scaffold_core.sampling import SamplingParams
    from scaffold_core.task import episode_context
    from scaffold_methods.arithmetic import ArithmeticTask, ArithmeticVerifier
    from scaffold_transformers.transformers_engine import TransformersEngine

    engine = ReplayEngine(TransformersEngine(max_batch_size=args.batch, batch_wait_ms=20, threads=args.threads),
                          replay=not args.no_replay)
    started = time.perf_counter()
    await engine.start()
    print(f"model loaded in {time.perf_counter() - started:.0f} s", flush=True)
    task = ArithmeticTask(count=args.problems, seed=args.seed)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    rows = list(task.load())
    pool = VerifierPool(ArithmeticVerifier(), timeout=30)
    tallies = []
    try:
        if table is None:
            table = methods(set(args.methods.split(",")) if args.methods else set())
        for name, make in table:
            contexts = [episode_context(task, i, row, engine.tokenizer, sampling) for i, row in enumerate(rows)]
            tally = Tally(name)
            runtime = Runtime(engine=engine, controller=make(), verifier=pool,
                              limits=Limits(concurrency=args.problems, request_timeout=3600, episode_timeout=7200))
            began = time.perf_counter()

            def done(result: Any, tally: Tally = tally, name: str = name) -> None:
                tally.add(result)
                if on_result is not None:
                    on_result(name, result)

            await runtime.run(contexts, done)
            tally.wall_s = time.perf_counter() - began
            print(tally.row(), f"(replayed {engine.hits}, computed {engine.misses} requests so far)", flush=True)
            tallies.append(tally)
    finally:
        pool.close()
        await engine.close()
    return tallies


def report(tallies: list[Tally]) -> None:
    by = {t.name: t for t in tallies}
    print()
    header = ("method", "accuracy", "95% CI", "policy", "verifier", "total", "wall s")
    print(f"{header[0]:<26} {header[1]:>7}  {header[2]:>14}  " + "  ".join(f"{h:>8}" for h in header[3:6])
          + f"  {header[6]:>7}")
    for t in tallies:
        print(t.row())
    print()
    majority, native = by.get("majority@8"), by.get("native")
    for online in (t for t in tallies if t.name.startswith("deepconf@8 online")):
        if majority and majority.policy:
            ratio = (online.policy + online.verifier) / (majority.policy + majority.verifier)
            gap = 100 * (online.accuracy - majority.accuracy)
            print(f"{online.name} vs majority@8: tokens {ratio:.2f}x (goal <= 0.60: {_met(ratio <= 0.6)}), "
                  f"accuracy {gap:+.1f} points (goal: within 2 points or better: {_met(gap >= -2)})")
    for dynasor in (t for t in tallies if t.name.startswith("dynasor")):
        if native and native.policy:
            saved = 1 - dynasor.policy / native.policy
            gap = 100 * (dynasor.accuracy - native.accuracy)
            print(f"{dynasor.name} vs native: {100 * saved:.0f}% fewer tokens (goal >= 25%: {_met(saved >= 0.25)}), "
                  f"accuracy {gap:+.1f} points (goal: within 2 points or better: {_met(gap >= -2)})")
    if tallies:
        n = tallies[0].episodes
        print(f"({n} problems: a 95% interval spans about +-{100 * 1.96 * math.sqrt(0.25 / max(1, n)):.0f} points; "
              "accuracy differences of a few points are within noise at this size)")


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="task seed (which sums) and sampling seed")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--methods", default="", help="comma-separated: majority,native,deepconf,best-of-8,"
                                                      "dynasor,tree (default: all)")
    parser.add_argument("--batch", type=int, default=48, help="the engine's max_batch_size")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-replay", action="store_true", help="compute identical requests again")
    args = parser.parse_args()
    started = time.perf_counter()
    tallies = asyncio.run(run_all(args))
    report(tallies)
    print(f"\ntotal {time.perf_counter() - started:.0f} s on this machine (shared CPUs: wall times vary with load)")
    return 0 if all(t.failed == 0 for t in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
