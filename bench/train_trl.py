"""GRPO with TRL on scaffold's rollouts, on CPU, with the bundled SmolLM2-135M-Instruct (not CI).

(a) Learning: a fixed-answer task the 135M model can learn in minutes. Prompts ask for a colour in
    different words; the reward is 1 when the answer contains the target word ("blue": about 6 % of
    the untrained model's answers at temperature 1). Held-out prompts (other wordings, never trained
    on) are scored before training and every ``--eval-every`` steps with ``--eval-samples`` samples
    each. Prints the reward curve and start vs end, steps and wall time, and writes
    ``reward_curve.png`` (matplotlib, a benchmark-only dependency) and ``bench.json`` to the run dir.
(b) Rollout-phase throughput, before training, on the same prompts and model: scaffold's rollout
    (the ``rollout_func`` TRL calls: dynamic batching, verification, trajectories) vs TRL's own
    generation (``GRPOTrainer._generate_single_turn``: one padded ``model.generate`` call), completions
    per second over the same prompts x generations at the same temperature and token budget. Goal:
    scaffold >= 1.5x.

(c) Filtering: the same training twice from the same seed, with ``filter_groups: none`` and
    ``zero_variance``; wall time of training (rollouts, refills and optimizer steps; evaluation not
    counted) until the step's reward (every sample it generated) first reaches ``--target-reward``
    (0.8), steps skipped and groups filtered. Goal: filtering never slower, faster where groups
    saturate (all wrong early, all right late).

    python bench/train_trl.py                       # all parts, defaults below
    python bench/train_trl.py --steps 30 --lr 5e-5  # longer run
    python bench/train_trl.py --skip-training       # only the throughput comparison
    python bench/train_trl.py --skip-training --skip-throughput   # only the filtering comparison
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

TRAIN = ["Name a color.", "Pick a color. Answer with one word.", "Tell me a color.", "Say a color.",
         "Which color do you like? Reply with a single word.", "Give me the name of a color.",
         "What is a nice color?", "Choose one color."]
HELD_OUT = ["What is your favorite color? One word.", "Name one colour.", "Think of a color and say it.",
            "Any color, please. Just the word."]


def plugin(target: str) -> Any:
    from scaffold_core import hookimpl
    from scaffold_core.verifier import Verdict, Verifier

    class ContainsTarget(Verifier):
        """Reward 1.0 when the response contains the target word (case-insensitive)."""

        def verify(self, response: str, reference: str | None) -> Verdict:
            hit = (reference or target).lower() in response.lower()
            return Verdict(1.0 if hit else 0.0, response.strip()[:40], None, "target" if hit else "other")

    class Plugin:
        @hookimpl
        def register_verifiers(self, registry):
            registry.add("contains_target", ContainsTarget)

    return Plugin()


def rows(questions: list[str], target: str) -> list[dict[str, str]]:
    return [{"id": f"q{i}", "question": q, "answer": target} for i, q in enumerate(questions)]


def build(args: argparse.Namespace, out: Path, filter_groups: str = "none") -> tuple[Any, Any]:
    import scaffold_testkit.plugin as test_tasks
    from scaffold_testkit import plugin_set

    import scaffold_trl
    from scaffold_core.config import load_config
    from scaffold_core.trainer import TrainJob

    pset = plugin_set(test_tasks, scaffold_trl, plugin(args.target))
    config = load_config(data={
        "task": {"name": "list", "rows": rows(TRAIN, args.target)},
        "verifier": {"name": "contains_target"},
        "engine": {"name": "transformers", "threads": args.threads, "max_batch_size": 64},
        "sampling": {"max_tokens": args.max_tokens, "temperature": 1.0, "seed": args.seed},
        "trainer": {"name": "trl", "max_steps": args.steps, "num_generations": args.generations,
                    "prompts_per_step": args.prompts, "learning_rate": args.lr, "seed": args.seed,
                    "threads": args.threads, "save_steps": max(1, args.steps), "filter_groups": filter_groups},
    }, registry=pset.registry)
    options = pset.registry.create("trainer", "trl", config.trainer.options)
    steps: list[Any] = []

    def report(step: Any) -> None:
        steps.append(step)
        m = step.metrics
        step.metrics["clock_s"] = time.perf_counter()
        loss = f"{m['loss']:+.4f}" if "loss" in m else "skipped"
        print(f"  step {step.step:3d}/{step.max_steps}  train reward {m['reward_mean']:.3f}  loss {loss}"
              f"  version {m['version']}  rollout {m['rollout_s']:.1f} s  step {m.get('step_time_s', 0):.1f} s"
              f"  filtered {m.get('groups_filtered', 0)}", flush=True)

    job = TrainJob(config=config, output_dir=out, report=report, registry=pset.registry)
    return scaffold_trl.GRPORun(options, job), steps


def held_out_reward(run: Any, target: str, samples: int) -> float:
    stats = copy.copy(run.rollouts.stats)  # evaluation does not count as training rollouts
    groups = run.run(run.rollouts.run_groups(rows(HELD_OUT, target), samples=samples, start_index=1000), 1800)
    run.rollouts.stats = stats
    rewards = [r for g in groups for r in g.rewards]
    return sum(rewards) / len(rewards)


def throughput(run: Any, n_prompts: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    """Completions/s of scaffold's rollout_func vs TRL's own generation on the same prompts."""
    import torch

    trainer, bridge = run.trainer, run.bridge
    generations = trainer.num_generations
    prompts = [p for p in run.index.prompts[:n_prompts] for _ in range(generations)]
    ids = [run.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    saved = (run.rollouts.sampling, copy.deepcopy(trainer.generation_config), dict(trainer.generation_kwargs))
    run.rollouts.sampling = saved[0].replace(max_tokens=max_tokens)
    trainer.generation_config.max_new_tokens = max_tokens
    trainer.generation_kwargs["max_new_tokens"] = max_tokens
    stats = copy.copy(run.rollouts.stats)
    history = len(bridge.history)
    # Warm-up, not timed: the first forward pass of a process pages the weights in from disk (tens of seconds
    # on a busy machine), whichever path runs first.
    bridge(prompts[:generations], trainer)
    trainer._generate_single_turn(ids[:generations], None, {}, generations)
    times: dict[str, list[float]] = {"scaffold": [], "trl": []}
    tokens: dict[str, list[int]] = {"scaffold": [], "trl": []}
    try:
        for i in range(repeats):
            for name in (("scaffold", "trl") if i % 2 == 0 else ("trl", "scaffold")):
                start = time.perf_counter()
                if name == "scaffold":
                    out = bridge(prompts, trainer)
                    n_tokens = sum(len(c) for c in out["completion_ids"])
                else:
                    with torch.random.fork_rng():
                        torch.manual_seed(i)
                        completions, _ = trainer._generate_single_turn(ids, None, {}, generations)
                    n_tokens = sum(len(c) for c in completions)
                times[name].append(time.perf_counter() - start)
                tokens[name].append(n_tokens)
    finally:
        run.rollouts.sampling = saved[0]
        trainer.generation_config, trainer.generation_kwargs = saved[1], saved[2]
        run.rollouts.stats = stats
        del bridge.history[history:]
    n = len(prompts)
    rate = {k: n / statistics.median(v) for k, v in times.items()}
    best = {k: n / min(v) for k, v in times.items()}
    return {"completions": n, "prompts": n_prompts, "generations": generations,
            "max_tokens": max_tokens, "repeats": repeats,
            "seconds": {k: [round(t, 2) for t in v] for k, v in times.items()},
            "tokens": tokens, "completions_per_s": {k: round(v, 2) for k, v in rate.items()},
            "tokens_per_s": {k: round(statistics.median(tokens[k]) / statistics.median(times[k]), 1)
                             for k in times},
            "ratio": round(rate["scaffold"] / rate["trl"], 2),
            "best_completions_per_s": {k: round(v, 2) for k, v in best.items()},
            "ratio_of_best": round(best["scaffold"] / best["trl"], 2)}


def time_to_reward(args: argparse.Namespace, out: Path, filter_groups: str) -> dict[str, Any]:
    """Train from scratch with ``filter_groups``; training wall time until the step reward reaches the target."""
    run, steps = build(args, out / filter_groups, filter_groups)
    with run:
        started = time.perf_counter()
        summary = run.train()
    reached = next((s for s in steps if s.metrics["reward_mean"] >= args.target_reward), None)
    return {"filter_groups": filter_groups, "steps": len(steps), "train_s": round(time.perf_counter() - started, 1),
            "reached_at_step": reached.step if reached else None,
            "seconds_to_target": round(reached.metrics["clock_s"] - started, 1) if reached else None,
            "steps_skipped": summary.get("steps_skipped", 0),
            "groups_filtered": sum(s.metrics.get("groups_filtered", 0) for s in steps),
            "reward_by_step": [round(s.metrics["reward_mean"], 3) for s in steps]}


def compare_filtering(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    print(f"\n(c) filtering: time to step reward >= {args.target_reward}, {args.steps} steps at most, "
          f"{args.prompts} prompts x {args.generations} generations", flush=True)
    runs = {}
    for mode in ("none", "zero_variance"):
        print(f"  filter_groups: {mode}", flush=True)
        runs[mode] = time_to_reward(args, out, mode)
    for mode, r in runs.items():
        to = f"{r['seconds_to_target']} s (step {r['reached_at_step']})" if r["reached_at_step"] else "not reached"
        print(f"  {mode:13s}: {to}; {r['steps']} steps in {r['train_s']} s, {r['steps_skipped']} skipped, "
              f"{r['groups_filtered']} groups filtered", flush=True)
    a, b = runs["none"]["seconds_to_target"], runs["zero_variance"]["seconds_to_target"]
    if a and b:
        print(f"  time to target, none / zero_variance: {a / b:.2f}x", flush=True)
    print(f"  training time, none / zero_variance: {runs['none']['train_s'] / runs['zero_variance']['train_s']:.2f}x",
          flush=True)
    return runs


def plot(path: Path, steps: list[Any], evals: list[tuple[int, float]], target: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot"
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s.step for s in steps], [s.metrics["reward_mean"] for s in steps], "o-", alpha=0.6,
            label="train reward (rollouts of the step)")
    ax.plot([e[0] for e in evals], [e[1] for e in evals], "s-", linewidth=2, label="held-out reward")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"mean reward (answer contains '{target}')")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("GRPO (TRL) on scaffold rollouts, SmolLM2-135M, CPU")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per optimizer step")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--target", default="blue")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-samples", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--throughput-tokens", type=int, default=64)
    parser.add_argument("--throughput-prompts", type=int, default=4, help="x --generations completions")
    parser.add_argument("--throughput-repeats", type=int, default=5)
    parser.add_argument("--target-reward", type=float, default=0.8, help="(c): the step reward to reach")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-filtering", action="store_true", help="skip (c), the filtering comparison")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--out", default=None, help="run directory (default runs/bench-train-trl-<time>)")
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out = Path(args.out or f"runs/bench-train-trl-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    print(f"run dir: {out}   load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    result: dict[str, Any] = {"args": vars(args)}
    wall = time.perf_counter()
    if not (args.skip_training and args.skip_throughput):
        run, steps = build(args, out)
        with run:
            print(f"setup (model, engine, trainer): {time.perf_counter() - wall:.1f} s", flush=True)
            if not args.skip_throughput:
                print(f"\n(b) rollout throughput: {args.throughput_prompts} prompts x {args.generations} generations, "
                      f"<= {args.throughput_tokens} tokens, temperature 1.0", flush=True)
                tp = throughput(run, args.throughput_prompts, args.throughput_tokens, args.throughput_repeats)
                result["throughput"] = tp
                for name in ("scaffold", "trl"):
                    print(f"  {name:8s}: {tp['completions_per_s'][name]:6.2f} completions/s (median run)  "
                          f"{tp['tokens_per_s'][name]:7.1f} tokens/s  runs {tp['seconds'][name]} s", flush=True)
                print(f"  ratio scaffold / TRL: {tp['ratio']:.2f}x of medians, "
                      f"{tp['ratio_of_best']:.2f}x of the fastest runs (goal >= 1.5x)", flush=True)
            if not args.skip_training:
                print(f"\n(a) GRPO: {args.steps} steps, {args.prompts} prompts x {args.generations} generations "
                      f"per step, lr {args.lr}, reward: answer contains {args.target!r}", flush=True)
                evals = [(0, held_out_reward(run, args.target, args.eval_samples))]
                print(f"  held-out reward before training: {evals[0][1]:.3f}", flush=True)
                from transformers import TrainerCallback

                class Eval(TrainerCallback):
                    def on_step_end(self, a: Any, state: Any, control: Any, **_: Any) -> None:
                        step = state.global_step
                        if step % args.eval_every == 0 or step == state.max_steps:
                            evals.append((step, held_out_reward(run, args.target, args.eval_samples)))
                            print(f"  held-out reward after step {step}: {evals[-1][1]:.3f}", flush=True)

                run.trainer.add_callback(Eval())
                started = time.perf_counter()
                summary = run.train()
                train_s = time.perf_counter() - started
                result["training"] = {"summary": summary, "held_out": evals, "train_s": round(train_s, 1),
                                      "train_reward": [s.metrics["reward_mean"] for s in steps]}
                print("\nreward curve (step: train / held-out)")
                held = dict(evals)
                for s in steps:
                    h = f"{held[s.step]:.3f}" if s.step in held else "  -  "
                    print(f"  {s.step:3d}: {s.metrics['reward_mean']:.3f} / {h}")
                print(f"held-out reward: start {evals[0][1]:.3f} -> end {evals[-1][1]:.3f} after "
                      f"{summary['steps']} steps in {train_s:.0f} s of training "
                      f"({train_s / max(1, summary['steps']):.1f} s/step)")
                print(f"plot: {plot(out / 'reward_curve.png', steps, evals, args.target)}")
    if not args.skip_filtering:
        result["filtering"] = compare_filtering(args, out)
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    result["load_average_end"] = os.getloadavg()
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"total wall time {result['wall_s']} s; figures in {out / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
