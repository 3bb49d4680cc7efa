"""On-policy distillation vs GRPO on CPU with the bundled SmolLM2-135M-Instruct (not CI).

1. A task the base model starts poor at but GRPO can learn. ``--task colour`` (default): prompts asking
   for a colour, reward 1 when the answer contains "blue" (a few % of the base model's answers; the task
   of ``bench/train_trl.py``), or ``--word``'s colour (green: rarer, so GRPO needs more steps).
   ``--task untuned``: the arithmetic task ``scaffold new-plugin`` makes (its rows or ``--rows``), exact
   match. Either is written into ``<work>/plugin`` and loaded through
   ``$SCAFFOLD_EXTRA_PLUGINS``, never installed.
2. GRPO from the base model for ``--steps`` steps (``scaffold train``): the GRPO curve, and its
   ``final/`` checkpoint is the teacher (``--teacher``: a checkpoint trained before, e.g. by a GRPO run with
   a larger batch; the GRPO run is then the baseline only).
3. OPD (``algorithm: opd``) from the base model with that teacher, same seed, batch and learning rate
   (``--opd-lr`` to change it), for ``--opd-steps`` steps; ``--variants opd,opd_mix`` adds OPD mixed with
   the verifier's reward (``opd_reward_weight: --mix``).

For each run: steps and wall-clock (sum of the steps' time, from ``train_timings.jsonl``) until a step's
mean reward first reaches ``--target`` (0.8), and the final reward, printed side by side with the load
(``uptime``). Goal: OPD reaches the target in at most half of GRPO's steps. Results go to
``<work>/results.json`` after each phase (a cut-short run still leaves its figures); the runs' folders
stay, and ``scaffold report`` overlays them in ``<work>/compare.html``.

    nice python bench/distill.py --work /tmp/distill-bench          # defaults below
    # OPD again (another learning rate) from the GRPO run already in --work
    nice python bench/distill.py --work /tmp/distill-bench --reuse-grpo --opd-lr 2e-4 --suffix=-lr2e-4
    python bench/distill.py --task untuned --rows learnable --steps 15
    # a rarer target: GRPO needs about 10 steps with this batch (the dense design of docs/training.md)
    nice python bench/distill.py --work /tmp/distill/green --word green --steps 20 --variants "" --threads 2
    # GRPO against OPD with a sparse signal (2 samples per prompt), from a teacher trained before, side by side
    nice python bench/distill.py --work /tmp/opd-bench/run3 --teacher /tmp/opd-bench/run1/grpo/final \
        --prompts 8 --generations 2 --steps 30 --variants opd --parallel
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

#: ``--rows`` of the untuned task. ``generated``: the four ``new-plugin`` writes; GRPO learns the two additions
#: and stalls at 0.5 (the bundled model never samples 6 * 7 = 42 or 10 - 4 = 6, so those groups never carry a
#: signal). ``learnable``: four sums whose bare-number answer the model can learn (it starts near 0: it answers
#: in prose; GRPO from the base model found no right answer in 8 steps). ``easy``: eight small sums.
ROWS = {
    "learnable": [("2 + 3", "5"), ("1 + 1", "2"), ("5 + 2", "7"), ("7 + 8", "15")],
    "easy": [("2 + 3", "5"), ("1 + 1", "2"), ("4 + 4", "8"), ("3 + 6", "9"), ("5 + 2", "7"), ("9 - 3", "6"),
             ("8 - 5", "3"), ("2 * 4", "8")],
}

#: ``--task colour``: the prompts of ``bench/train_trl.py`` (reward 1 when the answer contains the target).
COLOUR_PROMPTS = ["Name a color.", "Pick a color. Answer with one word.", "Tell me a color.", "Say a color.",
                  "Which color do you like? Reply with a single word.", "Give me the name of a color.",
                  "What is a nice color?", "Choose one color."]
COLOUR_PLUGIN = '''"""The colour task of bench/distill.py: reward 1 when the answer contains the target word."""
from scaffold_core import Task, hookimpl
from scaffold_core.verifier import Verdict, Verifier

ROWS = {rows!r}


class ColourTask(Task):
    default_config = {{"verifier": {{"name": "contains_target"}}}}

    def load(self):
        return list(ROWS)

    def messages(self, row):
        return [{{"role": "user", "content": row["question"]}}]

    def reference(self, row):
        return row["answer"]


class ContainsTarget(Verifier):
    def verify(self, response, reference):
        hit = str(reference).lower() in response.lower()
        return Verdict(1.0 if hit else 0.0, response.strip()[:40], None, "target" if hit else "other")


@hookimpl
def register_tasks(registry):
    registry.add("distill_colour", ColourTask)


@hookimpl
def register_verifiers(registry):
    registry.add("contains_target", ContainsTarget)
'''


def _env(path: Path, module: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    env["SCAFFOLD_EXTRA_PLUGINS"] = module
    return env


def make_task(work: Path, task: str = "colour", rows: str = "generated", target: str = "blue") \
        -> tuple[str, dict[str, str]]:
    """Write the task's plugin into ``work/plugin``: its task name, and the environment that loads it without
    installing it."""
    folder = work / "plugin"
    folder.mkdir(parents=True, exist_ok=True)
    if task == "colour":
        chosen = [{"id": f"q{i}", "question": q, "answer": target} for i, q in enumerate(COLOUR_PROMPTS)]
        (folder / "distill_colour.py").write_text(COLOUR_PLUGIN.format(rows=chosen))
        return "distill_colour", _env(folder, "distill_colour")
    if not (folder / f"scaffold-{NAME}").exists():
        subprocess.run([sys.executable, "-m", "scaffold_core.cli", "new-plugin", NAME, "--dir", str(folder)],
                       check=True, timeout=120)
    source_file = folder / f"scaffold-{NAME}" / f"scaffold_{NAME}" / "task.py"
    source = source_file.read_text()
    marker = "\n# rows of the benchmark:\n"
    source = source.split(marker)[0]
    if rows in ROWS:
        picked = [{"id": f"{rows}-{i}", "question": f"What is {q}?", "answer": a}
                  for i, (q, a) in enumerate(ROWS[rows])]
        source += f"{marker}ROWS[:] = {picked!r}\n"
    source_file.write_text(source)
    return NAME, _env(folder / f"scaffold-{NAME}", f"scaffold_{NAME}")


def config(args: argparse.Namespace, task: str, out: Path, steps: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "task": {"name": task},
        "engine": {"name": "transformers", "threads": args.threads, "max_batch_size": 64},
        "sampling": {"max_tokens": args.max_tokens, "temperature": 1.0, "seed": args.seed},
        "output": {"dir": str(out)},
        "trainer": {"name": "trl", "max_steps": steps, "num_generations": args.generations,
                    "prompts_per_step": args.prompts, "learning_rate": args.lr, "seed": args.seed,
                    "threads": args.threads, "save_steps": steps, "filter_groups": "none", **extra},
    }


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def train(name: str, cfg: dict[str, Any], work: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    return finish(start(name, cfg, work, env), timeout)


def start(name: str, cfg: dict[str, Any], work: Path, env: dict[str, str]) -> dict[str, Any]:
    """Start ``scaffold train`` for one run (``finish`` waits for it): runs started together share the CPU."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    print(f"== {name}: scaffold train {path}  ({uptime()})", flush=True)
    log = open(work / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "scaffold_core.cli", "train", str(path), "--overwrite",
                             "--no-progress"], env=env, stdout=log, stderr=subprocess.STDOUT)
    return {"proc": proc, "log": log, "started": time.perf_counter(), "out": Path(cfg["output"]["dir"])}


def finish(run: dict[str, Any], timeout: float) -> dict[str, Any]:
    proc, out = run["proc"], run["out"]
    try:
        proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - run["started"])))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=60)
    finally:
        run["log"].close()
    wall = time.perf_counter() - run["started"]
    return {"rc": proc.returncode, "wall_s": round(wall, 1), "out": str(out), "uptime_after": uptime(),
            "steps": _jsonl(out / "train_metrics.jsonl"), "timings": _jsonl(out / "train_timings.jsonl")}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reach(result: dict[str, Any], target: float) -> dict[str, Any]:
    rewards = [s.get("reward_mean") for s in result["steps"]]
    step_s = [t.get("step_time_s") or 0.0 for t in result["timings"]]
    first = next((i for i, r in enumerate(rewards) if r is not None and r >= target), None)
    clock = None if first is None else round(sum(step_s[:first + 1]), 1)  # steps' own time, no model loading
    kl = [s.get("teacher_kl") for s in result["steps"]]
    return {"rewards": [None if r is None else round(r, 3) for r in rewards],
            "teacher_kl": [None if k is None else round(k, 3) for k in kl] if any(k is not None for k in kl)
            else None, "step_s": [round(t, 1) for t in step_s],
            "steps_to_target": None if first is None else first + 1, "wall_s_to_target": clock,
            "final_reward": rewards[-1] if rewards else None, "rc": result["rc"], "wall_s": result["wall_s"],
            "out": result["out"], "uptime_after": result["uptime_after"]}


def table(results: dict[str, Any], names: list[str], target: float) -> str:
    lines = [f"{'run':8s} {'steps to ' + str(target):>12s} {'s to ' + str(target):>10s} {'final':>6s} "
             f"{'steps':>5s}  rewards per step"]
    for name in names:
        r = results.get(name)
        if not r:
            continue
        steps = "-" if r["steps_to_target"] is None else str(r["steps_to_target"])
        clock = "-" if r["wall_s_to_target"] is None else f"{r['wall_s_to_target']:.0f}"
        final = "-" if r["final_reward"] is None else f"{r['final_reward']:.3f}"
        curve = ", ".join("-" if x is None else f"{x:.2f}" for x in r["rewards"])
        lines.append(f"{name:8s} {steps:>12s} {clock:>10s} {final:>6s} {len(r['rewards']):>5d}  {curve}")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/distill-bench")
    parser.add_argument("--task", choices=("colour", "untuned"), default="colour")
    parser.add_argument("--word", default="blue",
                        help="--task colour: the colour an answer must contain (blue: a few %% of the base model's "
                             "answers; green or yellow: rarer, so GRPO waits longer for a rewarded sample)")
    parser.add_argument("--rows", choices=("generated", *ROWS), default="generated",
                        help="--task untuned: the rows new-plugin generates, or one of ROWS")
    parser.add_argument("--steps", type=int, default=15, help="steps of the GRPO run (the baseline and the teacher)")
    parser.add_argument("--opd-steps", type=int, default=None, help="steps of each OPD run (default: --steps)")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--opd-lr", type=float, default=None, help="learning rate of the OPD runs (default: --lr)")
    parser.add_argument("--variants", default="opd",
                        help="OPD runs after the GRPO one, in order: opd, opd_mix (OPD plus the verifier's reward)")
    parser.add_argument("--mix", type=float, default=1.0, help="opd_reward_weight of opd_mix")
    parser.add_argument("--top-k-weight", type=float, default=0.0,
                        help="opd_top_k_weight of the OPD runs (0: off; the teacher then returns --top-k)")
    parser.add_argument("--top-k", type=int, default=8, help="the teacher's top_k when --top-k-weight > 0")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per phase")
    parser.add_argument("--reuse-grpo", action="store_true", help="keep the GRPO run (and teacher) already in --work")
    parser.add_argument("--teacher", default=None,
                        help="a teacher trained before (a scaffold train run's final/ folder): the GRPO run is then "
                             "only the baseline, and may use another batch than the teacher's run")
    parser.add_argument("--parallel", action="store_true",
                        help="with --teacher: start the GRPO baseline and the OPD runs together (--threads each), "
                             "so they share the machine alike and their wall-clock times compare")
    parser.add_argument("--suffix", default="",
                        help="appended to the OPD runs' folder names (--suffix=-lr2e-4: with = for a leading dash)")
    args = parser.parse_args()
    if args.parallel and not args.teacher:
        parser.error("--parallel needs --teacher: without one, the OPD runs wait for the GRPO run's checkpoint")
    return args


def main() -> None:
    args = parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    task, env = make_task(work, args.task, args.rows, args.word)
    save = work / "results.json"
    grpo_dir = work / "grpo"
    teacher_model = args.teacher or str(grpo_dir / "final")
    teacher: dict[str, Any] = {"model": teacher_model, "threads": args.threads}
    opd: dict[str, Any] = {"algorithm": "opd", "teacher": teacher}
    if args.opd_lr is not None:
        opd["learning_rate"] = args.opd_lr
    if args.top_k_weight > 0:
        teacher["top_k"] = args.top_k
        opd["opd_top_k_weight"] = args.top_k_weight
    variants = {"opd": opd, "opd_mix": {**opd, "opd_reward_weight": args.mix}}
    runs_to_start = [(variant + args.suffix, variants[variant]) for variant in filter(None, args.variants.split(","))]
    if args.teacher and not (Path(args.teacher) / "config.json").exists():
        sys.exit(f"--teacher {args.teacher}: no checkpoint there (config.json missing); give a scaffold train "
                 "run's final/ folder")
    baseline = not (args.reuse_grpo and (grpo_dir / "final").exists())
    if baseline:
        shutil.rmtree(grpo_dir, ignore_errors=True)
        if args.parallel:  # the GRPO baseline beside the OPD runs (only with a --teacher trained before)
            runs_to_start.insert(0, ("grpo", {}))
        else:
            r = train("grpo", config(args, task, grpo_dir, args.steps, {}), work, env, args.timeout)
            record(save, "grpo", reach(r, args.target), vars(args))
            if not args.teacher and not (grpo_dir / "final").exists():
                sys.exit(f"the GRPO run left no checkpoint in {grpo_dir / 'final'}: see {work / 'grpo.log'}")
    elif "grpo" not in _load(save).get("runs", {}):  # a GRPO run whose bench process was stopped: read its folder
        found = {"rc": 0, "wall_s": None, "out": str(grpo_dir), "uptime_after": None,
                 "steps": _jsonl(grpo_dir / "train_metrics.jsonl"), "timings": _jsonl(grpo_dir / "train_timings.jsonl")}
        record(save, "grpo", reach(found, args.target), vars(args))
    if args.parallel:
        started = [(name, start(name, config(args, task, work / name,
                                             args.steps if name == "grpo" else args.opd_steps or args.steps, extra),
                                work, env)) for name, extra in runs_to_start]
        for name, run in started:
            record(save, name, reach(finish(run, args.timeout), args.target), vars(args))
    else:
        for name, extra in runs_to_start:
            r = train(name, config(args, task, work / name, args.opd_steps or args.steps, extra), work, env,
                      args.timeout)
            record(save, name, reach(r, args.target), vars(args))

    summarize(args, work, save)


def summarize(args: argparse.Namespace, work: Path, save: Path) -> None:
    # every run of this folder (OPD runs of other invocations too, and runs whose bench process was stopped:
    # read from their folders), side by side
    results = _load(save)
    runs = results.get("runs", {})
    for metrics in sorted(work.glob("*/train_metrics.jsonl")):
        folder = metrics.parent
        if folder.name not in runs:
            found = {"rc": None, "wall_s": None, "out": str(folder), "uptime_after": uptime(),
                     "steps": _jsonl(metrics), "timings": _jsonl(folder / "train_timings.jsonl")}
            cfg = yaml.safe_load((work / f"{folder.name}.yaml").read_text()) \
                if (work / f"{folder.name}.yaml").exists() else {}
            lr = (cfg.get("trainer") or {}).get("learning_rate")
            runs[folder.name] = {**reach(found, args.target), "lr": lr, "stopped": True}
    names = ["grpo", *sorted(n for n in runs if n != "grpo")]
    print(f"\n{table(runs, names, args.target)}")
    for name in names:
        if name in runs:
            r = runs[name]
            print(f"  {name}: {r['out']} (lr {r.get('lr')}; load after: {r['uptime_after']})")
    g = runs.get("grpo", {}).get("steps_to_target")
    for name in names[1:]:
        o = runs.get(name, {}).get("steps_to_target")
        if g and o:
            print(f"{name} reached {args.target} in {o} steps, GRPO in {g}: ratio {o / g:.2f} (goal <= 0.5)")
        else:
            print(f"steps to {args.target}: {name} {o}, GRPO {g} (None: not reached)")
    dirs = [runs[n]["out"] for n in names if n in runs]
    compare = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "report", *dirs, "-o",
                              str(work / "compare.html")], capture_output=True, text=True, timeout=600)
    print("comparison:", compare.stdout.strip() or compare.stderr.strip()[-500:])
    print(f"now: {uptime()}")


def _load(save: Path) -> dict[str, Any]:
    return json.loads(save.read_text()) if save.exists() else {}


def record(save: Path, name: str, figures: dict[str, Any], args: dict[str, Any]) -> None:
    """Add one run's figures to ``save`` (read again first: OPD runs of other invocations may write beside)."""
    lr = args["lr"] if name == "grpo" or args.get("opd_lr") is None else args["opd_lr"]
    results = _load(save)
    results.setdefault("runs", {})[name] = {**figures, "lr": lr, "args": args}
    tmp = save.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(save)
    print(f"{name}:", json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
