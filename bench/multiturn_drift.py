"""Multi-turn GSM8K on SmolLM2 over the whole bundled sample: template drift, re-tokenization mismatch, speed.

Runs `scaffold run`'s code path (Rollout) on the `multiturn_gsm8k` task with
the embedded transformers engine, then the same conversations' controller
overhead on the benchmark-only canned engine (no model).

    python bench/multiturn_drift.py                      # 32 problems, 3 turns, 96 tokens a turn, T=1.0
    python bench/multiturn_drift.py --limit 8 --max-tokens 48 --temperature 0
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def run(config: dict, out: Path) -> dict:
    from scaffold_core.config import load_config
    from scaffold_core.run.rollout import Rollout

    return Rollout(load_config(data=config), output_dir=out).run()


def canned_overhead(n: int, max_turns: int) -> str:
    """Conversations/s of the multi-turn path with the model taken out (benchmark-only canned engine)."""
    from scaffold_testkit import make_contexts, run_episodes

    from scaffold_core.engines.canned import CannedBenchmarkEngine
    from scaffold_core.plugins import get_registry
    from scaffold_core.sampling import SamplingParams

    registry = get_registry()
    task = registry.create("task", "multiturn_gsm8k", {"source": "sample"})
    options = {k: v for k, v in task.default_config["controller"].items() if k != "name"}
    controller = registry.create("controller", "multiturn_chat", {**options, "max_turns": max_turns})
    engine = CannedBenchmarkEngine("Half of 8 is 4.\n#### 4")
    rows = task.load()
    contexts = make_contexts(task, engine.tokenizer, SamplingParams(max_tokens=64))
    contexts = [c for _ in range(max(1, n // len(rows))) for c in contexts]
    for i, ctx in enumerate(contexts):
        ctx.episode_id = f"{ctx.episode_id}-{i}"
    started = time.perf_counter()
    results = run_episodes(contexts, engine=engine, controller=controller,
                           verifier=registry.create("verifier", "gsm8k", {}),
                           trajectory_maker=registry.create("trajectory_maker", "multiturn", {}),
                           concurrency=256, timeout=3600)
    wall = time.perf_counter() - started
    assert all(r.ok for r in results)
    return (f"canned engine (no model): {len(results)} conversations of {max_turns} turns in {wall:.1f} s = "
            f"{len(results) / wall:.0f} conversations/s (controller, rendering, drift check, verification, "
            "trajectories)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--canned-episodes", type=int, default=2000)
    args = parser.parse_args()

    base = {
        "task": {"name": "multiturn_gsm8k", "source": "sample", "limit": args.limit},
        "controller": {"name": "multiturn_chat", "max_turns": args.max_turns, "turn_discount": 0.5},
        "sampling": {"max_tokens": args.max_tokens, "temperature": args.temperature},
        "rollout": {"progress": False, "concurrency": 64},
    }
    with tempfile.TemporaryDirectory(prefix="scaffold-bench-multiturn-") as tmp:
        model = dict(base, engine={"name": "transformers", "threads": args.threads})
        started = time.perf_counter()
        metrics = run(model, Path(tmp) / "model")
        wall = time.perf_counter() - started
        from scaffold_core.output import read_records

        records = list(read_records(Path(tmp) / "model"))
        kinds: dict[str, int] = {}
        for record in records:
            for sample in record["samples"]:
                kind = (sample.get("metadata") or {}).get("drift", {}).get("kind")
                kinds[str(kind)] = kinds.get(str(kind), 0) + 1
        print(f"SmolLM2, {metrics['episodes']} problems of the bundled sample, up to {args.max_turns} turns of "
              f"{args.max_tokens} tokens, temperature {args.temperature}:")
        for key in ("completed", "failed", "turns", "accuracy", "reward_mean", "drift", "drift_template",
                    "drift_boundary", "retokenize_mismatch", "generated_tokens", "tokens_per_s"):
            print(f"  {key:22s} {metrics.get(key)}")
        print(f"  {'drift kinds':22s} {kinds}")
        print(f"  {'wall s (with load)':22s} {wall:.1f}")

    print(canned_overhead(args.canned_episodes, args.max_turns))
    return 0 if metrics["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
