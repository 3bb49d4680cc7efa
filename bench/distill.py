"""On-policy distillation vs GRPO on CPU with the bundled SmolLM2-135M-Instruct (not CI).

1. A task the base model starts poor at: the untuned arithmetic task ``scaffold new-plugin`` makes
   (four questions, an exact-match verifier), generated into the work folder and loaded through
   ``$SCAFFOLD_EXTRA_PLUGINS``.
2. A teacher: ``scaffold train`` with GRPO on it for ``--teacher-steps`` steps (its ``final/`` folder).
3. From the base model, side by side with the same seed and budget: GRPO alone, and OPD
   (``algorithm: opd``) from that teacher. For each: steps and wall-clock (sum of the steps' time, from
   ``train_timings.jsonl``) until the step's mean reward first reaches ``--target`` (0.8), and the final
   reward. Goal: OPD reaches the target in at most half of GRPO's steps.

Every phase is a ``scaffold train`` subprocess; results go to ``<work>/results.json`` after each phase
(so a cut-short run still leaves its figures).

    python bench/distill.py                          # defaults below
    python bench/distill.py --steps 10 --teacher-steps 15 --work /tmp/distill-bench
    # rows the model can learn; the teacher continues a checkpoint; GRPO and OPD in two processes side by side
    python bench/distill.py --work /tmp/d-opd --rows learnable --teacher-from TEACHER --teacher-steps 3 \
        --variants opd --steps 8
    python bench/distill.py --work /tmp/d-grpo --rows learnable --variants grpo --steps 8 --reuse-teacher

``--variants`` runs any of ``opd``, ``grpo`` and ``opd_mix`` (OPD with ``opd_reward_weight: --mix``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

NAME = "untuned"


#: ``--rows``: the task's rows. ``generated``: the four ``new-plugin`` writes; GRPO's teacher learns the two
#: additions and stalls at 0.5 (the bundled model never samples 6 * 7 = 42 or 10 - 4 = 6, so those groups never
#: carry a signal). ``learnable``: four questions whose bare-number answer the model can learn (it starts near 0:
#: it answers in prose). ``easy``: eight small sums; the model's bare-number arithmetic gets half of them wrong.
ROWS = {
    "learnable": [("2 + 3", "5"), ("1 + 1", "2"), ("5 + 2", "7"), ("7 + 8", "15")],
    "easy": [("2 + 3", "5"), ("1 + 1", "2"), ("4 + 4", "8"), ("3 + 6", "9"), ("5 + 2", "7"), ("9 - 3", "6"),
             ("8 - 5", "3"), ("2 * 4", "8")],
}


def make_task(work: Path, rows: str = "generated") -> dict[str, str]:
    """Generate the plugin (its rows replaced when ``rows`` is ``easy``); the environment that loads it
    without installing it."""
    folder = work / "plugin"
    if not (folder / f"scaffold-{NAME}").exists():
        subprocess.run([sys.executable, "-m", "scaffold_core.cli", "new-plugin", NAME, "--dir", str(folder)],
                       check=True, timeout=120)
    task = folder / f"scaffold-{NAME}" / f"scaffold_{NAME}" / "task.py"
    source = task.read_text()
    marker = "\n# rows of the benchmark:\n"
    source = source.split(marker)[0]
    if rows in ROWS:
        chosen = [{"id": f"{rows}-{i}", "question": f"What is {q}?", "answer": a}
                  for i, (q, a) in enumerate(ROWS[rows])]
        source += f"{marker}ROWS[:] = {chosen!r}\n"
    task.write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder / f"scaffold-{NAME}"), env.get("PYTHONPATH")]))
    env["SCAFFOLD_EXTRA_PLUGINS"] = f"scaffold_{NAME}"
    return env


def config(args: argparse.Namespace, out: Path, steps: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "task": {"name": NAME},
        "engine": {"name": "transformers", "threads": args.threads, "max_batch_size": 64},
        "sampling": {"max_tokens": args.max_tokens, "temperature": 1.0, "seed": args.seed},
        "output": {"dir": str(out)},
        "trainer": {"name": "trl", "max_steps": steps, "num_generations": args.generations,
                    "prompts_per_step": 4, "learning_rate": args.lr, "seed": args.seed, "threads": args.threads,
                    "save_steps": steps, **extra},
    }


def train(name: str, cfg: dict[str, Any], work: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    out = Path(cfg["output"]["dir"])
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    started = time.perf_counter()
    print(f"== {name}: scaffold train {path}", flush=True)
    with open(work / f"{name}.log", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "train", str(path), "--overwrite",
                               "--no-progress", "--no-report"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=timeout)
    wall = time.perf_counter() - started
    steps = [json.loads(line) for line in (out / "train_metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (out / "train_metrics.jsonl").exists() else []
    timings = [json.loads(line) for line in (out / "train_timings.jsonl").read_text().splitlines()
               if line.strip()] if (out / "train_timings.jsonl").exists() else []
    return {"rc": proc.returncode, "wall_s": round(wall, 1), "out": str(out), "steps": steps, "timings": timings}


def reach(result: dict[str, Any], target: float) -> dict[str, Any]:
    rewards = [s.get("reward_mean") for s in result["steps"]]
    step_s = [t.get("step_time_s") or 0.0 for t in result["timings"]]
    first = next((i for i, r in enumerate(rewards) if r is not None and r >= target), None)
    clock = None if first is None else round(sum(step_s[:first + 1]), 1)  # steps' own time, no model loading
    kl = [s.get("teacher_kl") for s in result["steps"]]
    return {"rewards": rewards, "teacher_kl": kl if any(k is not None for k in kl) else None,
            "step_s": [round(t, 1) for t in step_s],
            "steps_to_target": None if first is None else first + 1, "wall_s_to_target": clock,
            "final_reward": rewards[-1] if rewards else None, "rc": result["rc"], "wall_s": result["wall_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/distill-bench")
    parser.add_argument("--teacher-steps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10, help="steps of each student run")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--rows", choices=("generated", *ROWS), default="generated",
                        help="the task's rows: those new-plugin generates, or one of ROWS")
    parser.add_argument("--teacher-from", default=None,
                        help="the teacher's starting checkpoint (default: the bundled model)")
    parser.add_argument("--variants", default="opd,grpo",
                        help="student runs, in order: opd, grpo, opd_mix (OPD mixed with the verifier's reward)")
    parser.add_argument("--mix", type=float, default=1.0, help="opd_reward_weight of opd_mix")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per phase")
    parser.add_argument("--reuse-teacher", action="store_true", help="keep a teacher trained earlier in --work")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = make_task(work, args.rows)
    results: dict[str, Any] = {"args": vars(args), "load": os.getloadavg()}
    save = work / "results.json"

    teacher_dir = work / "teacher"
    if not (args.reuse_teacher and (teacher_dir / "final").exists()):
        shutil.rmtree(teacher_dir, ignore_errors=True)
        cfg = config(args, teacher_dir, args.teacher_steps, {})
        if args.teacher_from:
            cfg["engine"]["model"] = args.teacher_from
        t = train("teacher", cfg, work, env, args.timeout)
        results["teacher"] = reach(t, args.target)
        save.write_text(json.dumps(results, indent=1))
        print("teacher:", json.dumps(results["teacher"]), flush=True)
    teacher = str(teacher_dir / "final")
    opd = {"algorithm": "opd", "teacher": {"model": teacher, "threads": args.threads}}
    variants = {"opd": opd, "grpo": {}, "opd_mix": {**opd, "opd_reward_weight": args.mix}}
    for name in args.variants.split(","):
        extra = variants[name]
        r = train(name, config(args, work / name, args.steps, extra), work, env, args.timeout)
        results[name] = reach(r, args.target)
        results["load_after_" + name] = os.getloadavg()
        save.write_text(json.dumps(results, indent=1))
        print(f"{name}:", json.dumps(results[name]), flush=True)
    g = results.get("grpo", {}).get("steps_to_target")
    o = results.get("opd", {}).get("steps_to_target")
    if g and o:
        results["opd_over_grpo_steps"] = round(o / g, 3)
        print(f"OPD reached {args.target} in {o} steps, GRPO in {g}: ratio {o / g:.2f} (goal <= 0.5)")
    else:
        print(f"steps to {args.target}: OPD {o}, GRPO {g} (None: not reached within {args.steps} steps)")
    save.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
