"""The report of a GSM8K-sized eval: 1,319 problems x 8 answers -> report.html's size and build time vs the goals.

    python bench/report_size.py                          # 1,319 x 8; goals: <= 10 MB, built in <= 5 s
    python bench/report_size.py --problems 200 --answers 16 --keep /tmp/report-bench
    python bench/report_size.py --run 200000 --chromium  # a real 200k-episode `scaffold run`; opened in Chromium

``--run N`` measures the report of a real run instead: ``scaffold run`` of N episodes on the benchmark_canned
engine (the set-up of bench/run_end_to_end.py, without the dataset), every episode with its spans, then
``scaffold report DIR`` in a child process (its wall time and the page's size; goals: <= 10 MB). ``--chromium``
also opens the page in headless Chromium (the system's, driven by Playwright) and times it from navigation
to the load event and to the first paint after it (goal: <= 2 s).

Builds a synthetic eval run directory through the real writers: each problem is an EpisodeResult of the
``repeat`` controller's shape (one branch per answer, its answer recorded on its samples), turned into
training rows by the built-in ``single_turn`` maker, recorded in the run's store by ``RunOutput``; the end of the
run is ``finalize_run_dir`` and ``eval.json`` comes from ``compute_eval``, as ``scaffold eval`` does. Sizes are
GSM8K's with a small model: few-shot prompts of about 420 tokens, answers of 60 to 360 tokens over a
49,152-token vocabulary with a logprob per token, about a third right. Then it times ``build_report`` with the
tokenizer already loaded (as at the end of ``scaffold eval``): SmolLM2's own from the converted-model cache
when it is there, else a synthetic one (``--tokenizer synthetic``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

GOAL_MB = 10.0
GOAL_S = 5.0
VOCAB = 49_152


class SyntheticTokenizer:
    """Token texts of a BPE vocabulary's typical lengths (one to eight characters)."""

    def batch_decode(self, batch, skip_special_tokens=False):
        words = ("the", " of", "ing", " 12", " =", "\n", " answer", " total", "s", " #", "##", " apples")
        return [words[ids[0] % len(words)] + ("" if ids[0] % 3 else str(ids[0] % 97)) for ids in batch]


def real_tokenizer():
    try:
        from scaffold_core.engines.model_loading import cached_model_dir, resolve_model

        cached = cached_model_dir(resolve_model(None))
        if cached is None:
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
    except Exception:
        return None


def episode(i: int, answers: int, rng: random.Random, maker):
    from scaffold_core.episode import EpisodeResult, Sample
    from scaffold_core.verifier import Verdict

    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(380, 460))]
    skill = rng.random()
    reference = str(rng.randint(2, 900))
    samples = []
    for branch in range(answers):
        n = rng.randint(60, 360)
        ids = [rng.randrange(VOCAB) for _ in range(n)]
        logprobs = [-rng.expovariate(3.0) for _ in range(n)]
        right = rng.random() < skill
        key = reference if right else str(rng.randint(2, 40))
        finish = "length" if rng.random() < 0.04 else "stop"
        verdict = Verdict(1.0 if right else 0.0, key, key, "match" if right else "wrong answer")
        text = f"Let me compute step by step ... #### {key}"
        sample = Sample(prompt, ids, logprobs, [1] * n, text, finish, branch, 0, verdict,
                        metadata={"branch": branch})
        sample.metadata["branch_answer"] = {"sample": branch, "extracted": key, "key": key,
                                            "reward": verdict.reward, "logprob": sum(logprobs) / n}
        samples.append(sample)
    result = EpisodeResult(episode_id=f"gsm8k-{i:05d}", index=i, status="ok", reference=reference,
                           prompt_text="Question: " + "Natalia sold clips to 48 of her friends in April. " * 30,
                           samples=samples, metrics={"answer_accuracy": skill})
    result.trajectories = maker.make(result)
    return result


def write_run(directory: Path, problems: int, answers: int) -> None:
    from scaffold_core.output.rundir import RunOutput
    from scaffold_core.plugins import get_plugins
    from scaffold_core.plugins.lifecycle import Hooks
    from scaffold_core.run.finalize import finalize_run_dir
    from scaffold_report.eval.command import compute_eval

    plugins = get_plugins()
    maker = plugins.registry.create("trajectory_maker", "single_turn", {})
    out = RunOutput(directory)
    rng = random.Random(0)
    try:
        for i in range(problems):
            out.append(episode(i, answers, rng, maker))
        out.close()
        (directory / "config.yaml").write_text(
            "task: {name: gsm8k, source: hub, split: test}\ncontroller: {name: repeat, n: " + str(answers)
            + ", controller: {name: native}}\nengine: {name: benchmark_canned}\nverifier: {name: exact_match}\n")
        finalize_run_dir(directory, {}, hooks=Hooks(plugins.pm), save_dataset=False)
    finally:
        out.release()
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= answers]
    figures = compute_eval(directory, ks, registry=plugins.registry)
    (directory / "eval.json").write_text(json.dumps(figures))


GOAL_OPEN_S = 2.0


def open_in_chromium(path: Path, repeat: int = 3) -> list[float]:
    """Seconds from navigation to the load event and a painted frame, for each of ``repeat`` fresh tabs."""
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("SCAFFOLD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    times = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu",
                                                                     "--disable-dev-shm-usage"], timeout=60_000)
        try:
            for _ in range(repeat):
                tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                started = time.perf_counter()
                tab.goto(path.as_uri(), wait_until="load", timeout=120_000)
                tab.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                times.append(time.perf_counter() - started)
                tab.close()
        finally:
            browser.close()
    return times


def real_run(episodes: int, root: Path, chromium: bool) -> int:
    """``scaffold run`` of ``episodes`` on the canned engine, then ``scaffold report`` on it, measured."""
    import subprocess

    import yaml

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_end_to_end import config_data, env_with_test_plugin, machine_line, scaffold_command

    config = root / "run.yaml"
    config.write_text(yaml.safe_dump(config_data(episodes, 1, save_dataset=False)), encoding="utf-8")
    directory = root / "run"
    print(machine_line())
    started = time.perf_counter()
    subprocess.run([*scaffold_command(), "run", str(config), "-o", str(directory), "--no-report"], check=True,
                   env=env_with_test_plugin(), stdout=subprocess.DEVNULL, timeout=7200)
    print(f"scaffold run: {episodes:,} episodes in {time.perf_counter() - started:.1f} s, store "
          f"{(directory / 'episodes.db').stat().st_size / 1e6:,.0f} MB")
    started = time.perf_counter()
    subprocess.run([*scaffold_command(), "report", str(directory)], check=True, env=env_with_test_plugin(),
                   stdout=subprocess.DEVNULL, timeout=3600)
    seconds = time.perf_counter() - started
    path = directory / "report.html"
    size = path.stat().st_size / 1e6
    trace = directory / "trace.json"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"scaffold report: report.html {size:.2f} MB (goal <= {GOAL_MB:g} MB), trace.json "
          f"{trace.stat().st_size / 1e6 if trace.exists() else 0:.1f} MB, {seconds:.1f} s (the command, start-up "
          f"included); load average {load:.2f}")
    ok = size <= GOAL_MB
    if chromium:
        times = open_in_chromium(path)
        print(f"Chromium: opened in {', '.join(f'{t:.2f}' for t in times)} s (goal <= {GOAL_OPEN_S:g} s; "
              f"navigation to the load event and a painted frame, fresh tabs); load average {os.getloadavg()[0]:.2f}")
        ok = ok and min(times) <= GOAL_OPEN_S
    print("within the goals" if ok else "OVER A GOAL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=1319)
    parser.add_argument("--answers", type=int, default=8)
    parser.add_argument("--tokenizer", choices=("real", "synthetic"), default="real")
    parser.add_argument("--keep", help="build in this folder and keep it (default: a temp folder, removed)")
    parser.add_argument("--run", type=int, metavar="EPISODES",
                        help="measure the report of a real `scaffold run` of this many episodes instead")
    parser.add_argument("--chromium", action="store_true", help="also time opening the page in headless Chromium")
    args = parser.parse_args()
    from scaffold_report.build import build_report

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="report-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    directory = root / "run"
    if directory.exists():
        shutil.rmtree(directory)
    if args.run:
        try:
            return real_run(args.run, root, args.chromium)
        finally:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    try:
        started = time.perf_counter()
        write_run(directory, args.problems, args.answers)
        store_mb = (directory / "episodes.db").stat().st_size / 1e6
        print(f"run directory: {args.problems:,} problems x {args.answers} answers, store {store_mb:,.0f} MB, "
              f"written in {time.perf_counter() - started:.1f} s")
        tokenizer = real_tokenizer() if args.tokenizer == "real" else None
        source = "SmolLM2's tokenizer" if tokenizer is not None else "a synthetic tokenizer"
        tokenizer = tokenizer or SyntheticTokenizer()
        started = time.perf_counter()
        path = build_report(directory, tokenizer=tokenizer)
        seconds = time.perf_counter() - started
        size = path.stat().st_size / 1e6
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"report.html: {size:.2f} MB (goal <= {GOAL_MB:g} MB), built in {seconds:.2f} s (goal <= {GOAL_S:g} s) "
              f"with {source}; load average {load:.2f}")
        ok = size <= GOAL_MB and seconds <= GOAL_S
        if args.chromium:
            times = open_in_chromium(path)
            print(f"Chromium: opened in {', '.join(f'{t:.2f}' for t in times)} s (goal <= {GOAL_OPEN_S:g} s)")
            ok = ok and min(times) <= GOAL_OPEN_S
        print("within the goals" if ok else "OVER A GOAL")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
