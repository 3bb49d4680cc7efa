"""Acceptance on the real GSM8K test split (skipped where ../shared/data/gsm8k is absent).

Every reference solution scores 1.0 against its own answer and 0.0 against
another problem's different answer, with the gsm8k and the math_verify verifier,
in process and through `scaffold score`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaffold_gsm8k.answers import canonical_number, gold_answer
from scaffold_gsm8k.task import GSM8KTask
from scaffold_gsm8k.verifier import GSM8KVerifier

ROOT = Path(__file__).resolve().parents[3]
DATA = Path(os.environ.get("SCAFFOLD_GSM8K_DATA", ROOT.parent / "shared" / "data" / "gsm8k"))
TEST_FILE = DATA / "test.jsonl"

pytestmark = pytest.mark.skipif(not TEST_FILE.is_file(), reason=f"GSM8K data not found at {DATA}")


@pytest.fixture(scope="module")
def records():
    with TEST_FILE.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def mismatched(records):
    """Each solution paired with the next problem (cyclically) whose gold answer is a different number."""
    keys = [canonical_number(gold_answer(r["answer"])) for r in records]
    pairs = []
    for i, record in enumerate(records):
        j = next(k % len(records) for k in range(i + 1, i + len(records)) if keys[k % len(records)] != keys[i])
        pairs.append((record["answer"], gold_answer(records[j]["answer"])))
    return pairs


def make_verifier(name: str):
    if name == "gsm8k":
        return GSM8KVerifier()
    from scaffold_gsm8k.math_verify_verifier import MathVerifyVerifier

    return MathVerifyVerifier()


BOTH_VERIFIERS = pytest.mark.parametrize("name", [
    "gsm8k",
    pytest.param("math_verify", marks=pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                                                         reason='needs: pip install "scaffold-gsm8k[math-verify]"')),
])


@BOTH_VERIFIERS
def test_every_reference_solution_scores_against_its_own_answer(records, name):
    assert len(records) == 1319
    verifier = make_verifier(name)
    verdicts = [verifier.verify(r["answer"], gold_answer(r["answer"])) for r in records]
    assert [v.reward for v in verdicts] == [1.0] * len(records)
    assert all(v.reason == "correct (####)" for v in verdicts)


@BOTH_VERIFIERS
def test_no_reference_solution_scores_against_another_answer(records, name):
    verifier = make_verifier(name)
    rewards = [verifier.verify(solution, other).reward for solution, other in mismatched(records)]
    assert rewards == [0.0] * len(records)


def test_flexible_mode_agrees_on_reference_solutions(records):
    verifier = GSM8KVerifier(mode="flexible")
    assert all(verifier.verify(r["answer"], gold_answer(r["answer"])).reward == 1.0 for r in records)


def test_data_files_source_reads_the_test_split(tmp_path):
    task = GSM8KTask(data_files=str(TEST_FILE), cache_dir=str(tmp_path / "cache"))
    rows = task.load()
    assert len(rows) == 1319 and not task.skipped
    assert rows[0]["id"] == "test-0" and task.reference(rows[0]) == "18"
    assert [r["id"] for r in GSM8KTask(data_files=str(TEST_FILE), cache_dir=str(tmp_path / "cache"),
                                       limit=3, shuffle=True, seed=7).load()] != ["test-0", "test-1", "test-2"]


def _score(path: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "score", "--verifier", "gsm8k",
                           "--input", str(path), "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_scaffold_score_reproduces_it_from_the_command_line(records, tmp_path):
    own = tmp_path / "own.jsonl"
    own.write_text("".join(json.dumps({"response": r["answer"], "answer": gold_answer(r["answer"])}) + "\n"
                           for r in records))
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"response": s, "answer": a}) + "\n" for s, a in mismatched(records)))
    summary = _score(own, tmp_path / "own-scored.jsonl")
    assert (summary["lines"], summary["correct"], summary["accuracy"]) == (1319, 1319, 1.0)
    summary = _score(other, tmp_path / "other-scored.jsonl")
    assert (summary["lines"], summary["correct"], summary["accuracy"]) == (1319, 0, 0.0)
    scored = [json.loads(line) for line in (tmp_path / "other-scored.jsonl").read_text().splitlines()]
    assert all(row["reward"] == 0.0 and row["extracted"] for row in scored)
