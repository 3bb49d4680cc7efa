"""Benchmark the gsm8k verifier: throughput on GSM8K reference solutions, worst case on adversarial input.

    python bench/gsm8k_verifier.py [--data DIR] [--json]

Prints verifications per second over the 1,319 reference solutions of the
GSM8K test split (each against its own answer; target >= 10,000/s) and the
time of every adversarial response (a megabyte of digits, markers, braces...;
median of 5 runs; target: the worst case well under 50 ms), in strict and flexible mode.
Without the GSM8K data (../shared/data/gsm8k beside the project), the
throughput figure uses the bundled sample instead and says so.
Exits 1 if a verdict is wrong (a reference solution not scoring 1.0, or 0.0 on
a mismatched answer); speed figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from scaffold_gsm8k.answers import canonical_number, gold_answer
from scaffold_gsm8k.data import read_sample
from scaffold_gsm8k.verifier import GSM8KVerifier

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "gsm8k"
THROUGHPUT_TARGET = 10_000
WORST_CASE_TARGET_MS = 50.0
MB = 1 << 20


def adversarial_cases() -> dict[str, str]:
    """Responses built to be slow or to game the reward; each about a megabyte or more."""
    return {
        "a megabyte of digits after ####": "#### " + "9" * MB,
        "a megabyte of digits, no marker": "7" * MB,
        "a megabyte of '1 ' (numbers everywhere)": "1 " * (MB // 2),
        "thousands groups 1,000,000,...": "#### 1" + ",000" * (MB // 4),
        "a broken thousands group at the end": "#### 1" + ",000" * (MB // 4) + "0",
        "a megabyte of decimal places": "#### 18." + "0" * MB,
        "a megabyte of '####'": "####" * (MB // 4),
        "'#### n' 100,000 times": "".join(f"#### {n}\n" for n in range(100_000)),
        "a megabyte of \\boxed{": "\\boxed{" * (MB // 7),
        "deeply nested braces in \\boxed": "\\boxed{" + "{" * MB + "18" + "}" * MB,
        "a megabyte of '}' then \\boxed{18}": "}" * MB + "\\boxed{18}",
        "\\boxed{ with a megabyte of digits": "\\boxed{" + "9" * MB + "}",
        "a megabyte of '-' before a digit": "#### " + "-" * MB + "5",
        "a megabyte of '$'": "#### " + "$" * MB,
        "a megabyte of '1/'": "#### " + "1/" * (MB // 2),
        "a fraction with 5,000-digit denominator": "#### 1/" + "7" * 5000,
        "a megabyte of '\\frac{'": "#### " + "\\frac{" * (MB // 6),
        "a megabyte of backslashes": "#### " + "\\" * MB + "5",
        "a megabyte of '.'": "#### " + "." * MB + "5",
        "a megabyte of ',' between digits": "1," * (MB // 2),
        "a megabyte of whitespace after ####": "####" + " " * MB + "\n" * 1000 + "18",
        "a megabyte of letters, no number": "x" * MB,
        "a megabyte of '=' after ####": "#### " + "=" * MB + "18",
        "unicode garbage": "\x00\ufffd\U0001F600\u2212" * (MB // 4) + "#### 18",
        "'**a' runs around the answer (markdown search)": "#### " + "**a" * 330 + "18",
        "180 words before the answer (dressing check)": "#### " + "word " * 180 + "18",
        "operators after the last number, no marker": "1 " * (MB // 2) + "18" + "^!" * 30,
        "empty response": "",
    }


def load_solutions(data_dir: Path) -> tuple[list[tuple[str, str]], str]:
    test_file = data_dir / "test.jsonl"
    if test_file.is_file():
        with test_file.open(encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        return [(r["answer"], gold_answer(r["answer"])) for r in records], str(test_file)
    records = read_sample("test")
    return [(r["answer"], gold_answer(r["answer"])) for r in records], "bundled sample (GSM8K data not found)"


def mismatched(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    keys = [canonical_number(gold) for _, gold in pairs]
    out = []
    for i, (solution, _) in enumerate(pairs):
        j = next(k % len(pairs) for k in range(i + 1, i + len(pairs)) if keys[k % len(pairs)] != keys[i])
        out.append((solution, pairs[j][1]))
    return out


def throughput(verifier: GSM8KVerifier, pairs: list[tuple[str, str]], passes: int = 7) -> float:
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        for response, reference in pairs:
            verifier.verify(response, reference)
        best = min(best, time.perf_counter() - start)
    return len(pairs) / best


def time_case(verifier: GSM8KVerifier, response: str, repeats: int = 5) -> float:
    """Median of ``repeats`` runs, in milliseconds (the median keeps other processes' noise out)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        verifier.verify(response, "18")
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding GSM8K test.jsonl")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)

    strict, flexible = GSM8KVerifier(), GSM8KVerifier(mode="flexible")
    pairs, source = load_solutions(args.data)
    own = sum(strict.verify(r, g).reward for r, g in pairs)
    other = sum(strict.verify(r, g).reward for r, g in mismatched(pairs))
    correct = own == len(pairs) and other == 0
    rate = throughput(strict, pairs)
    rate_flexible = throughput(flexible, pairs)

    cases = adversarial_cases()
    timings = {name: {"strict": time_case(strict, text), "flexible": time_case(flexible, text)}
               for name, text in cases.items()}
    worst_name, worst = max(((n, max(t.values())) for n, t in timings.items()), key=lambda x: x[1])
    median = statistics.median(max(t.values()) for t in timings.values())

    result = {
        "source": source,
        "reference_solutions": len(pairs),
        "own_answer_correct": int(own),
        "other_answer_correct": int(other),
        "verdicts_correct": correct,
        "verifications_per_s": round(rate),
        "verifications_per_s_flexible": round(rate_flexible),
        "throughput_target_per_s": THROUGHPUT_TARGET,
        "adversarial_cases": len(cases),
        "adversarial_worst_ms": round(worst, 3),
        "adversarial_worst_case": worst_name,
        "adversarial_median_ms": round(median, 3),
        "worst_case_target_ms": WORST_CASE_TARGET_MS,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("gsm8k verifier benchmark")
        print(f"reference solutions: {len(pairs)} from {source}")
        print(f"  own answer: {int(own)}/{len(pairs)} scored 1.0; another problem's answer: {int(other)}/{len(pairs)} "
              f"scored 1.0 ({'correct' if correct else 'WRONG'})")
        mark = "ok" if rate >= THROUGHPUT_TARGET else "MISSED"
        print(f"  throughput: {rate:,.0f} verifications/s strict, {rate_flexible:,.0f}/s flexible "
              f"(best of 7 passes; target >= {THROUGHPUT_TARGET:,}/s: {mark})")
        print(f"adversarial responses: {len(cases)} cases, median of 5 runs each, strict / flexible (ms)")
        for name, t in sorted(timings.items(), key=lambda kv: -max(kv[1].values())):
            print(f"  {t['strict']:8.2f} {t['flexible']:8.2f}  {name}")
        mark = "ok" if worst < WORST_CASE_TARGET_MS else "MISSED"
        print(f"  worst case: {worst:.2f} ms ({worst_name}); median {median:.2f} ms "
              f"(target < {WORST_CASE_TARGET_MS:g} ms: {mark})")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
