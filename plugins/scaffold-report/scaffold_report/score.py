"""``scaffold score``: re-score saved responses with any installed verifier."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from scaffold_core.config import parse_override
from scaffold_core.errors import ConfigError, VerifierError
from scaffold_core.output.codec import one_line
from scaffold_core.plugins import get_registry
from scaffold_core.run.verifier_pool import VerifierPool
from scaffold_core.textfiles import utf8_lines
from scaffold_core.verifier import Verdict

CHUNK = 512


def score_file(verifier_name: str, input_path: str, output_path: str | None = None,
               options: list[str] | None = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """Score every line of ``input_path`` (fields ``response`` and ``answer``; others are kept).

    ``answer`` is the reference, any JSON value (a string, a number, a list of acceptable answers,
    a dict the verifier understands, or null), passed to the verifier as it is.
    A line the verifier cannot score (a gold answer it cannot use, a verifier error or timeout) does not
    stop the others: it is listed in ``unscored`` with its line number and error, and written to the
    output with ``reward: null`` and that ``error``. A line the verifier declines to reward (its verdict is
    unscored: no reference answer, a judgement that does not parse) is written with ``reward: null`` and
    ``scored: false``, listed in ``no_reward`` and left out of the means; it is not an error.
    A line that is not UTF-8, not JSON or lacks a field is an error naming the file and line.
    """
    opts: dict[str, Any] = {}
    for text in options or []:
        parts, value = parse_override(text)
        opts[".".join(parts)] = value
    verifier = get_registry().create("verifier", verifier_name, opts, path="--verifier")
    source = Path(input_path)
    if not source.is_file():
        raise ConfigError(f"--input: {input_path} does not exist")
    rows: list[dict[str, Any]] = []
    numbers: list[int] = []
    for number, line in utf8_lines(source, error=ConfigError):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{input_path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(row, dict) or "response" not in row or "answer" not in row:
            raise ConfigError(f"{input_path}:{number}: each line needs 'response' and 'answer' fields")
        rows.append(row)
        numbers.append(number)
    verdicts = asyncio.run(_score(verifier, verifier_name, rows, timeout))
    correct = 0
    scored = 0
    reward_sum = 0.0
    unscored = []
    no_reward: list[dict[str, Any]] = []
    for row, number, verdict in zip(rows, numbers, verdicts):
        if not isinstance(verdict, Verdict):
            row["reward"] = row["extracted"] = None
            row["error"] = str(verdict)
            unscored.append({"line": number, "error": str(verdict)})
            continue
        row["extracted"] = verdict.extracted
        row["reason"] = verdict.reason
        if not verdict.scored:  # the verifier gave no reward (no reference to compare with): null, never 0
            row["reward"] = None
            row["scored"] = False
            no_reward.append({"line": number, "reason": verdict.reason})
            continue
        row["reward"] = verdict.reward
        scored += 1
        reward_sum += verdict.reward
        correct += verdict.reward > 0
    if output_path:
        target = Path(output_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(one_line(json.dumps(row, ensure_ascii=False).encode("utf-8")).decode("utf-8") + "\n")
    return {
        "input": str(source),
        "verifier": verifier_name,
        "lines": len(rows),
        "scored": scored,
        "correct": correct,
        "accuracy": round(correct / scored, 6) if scored else 0.0,
        "reward_mean": round(reward_sum / scored, 6) if scored else 0.0,
        **({"unscored": unscored} if unscored else {}),
        **({"no_reward": no_reward} if no_reward else {}),
        **({"output": output_path} if output_path else {}),
    }


async def _score(verifier: Any, name: str, rows: list[dict[str, Any]], timeout: float) -> list[Any]:
    """A Verdict per row, or the error that kept that row from being scored."""
    pool = VerifierPool(verifier, timeout=timeout, workers=2, name=name)
    out: list[Any] = [None] * len(rows)
    todo = list(range(len(rows)))
    try:
        for start in range(0, len(todo), CHUNK):
            chunk = todo[start:start + CHUNK]
            items = [(str(rows[i]["response"]), rows[i]["answer"]) for i in chunk]
            try:
                verdicts: list[Any] = await pool.verify_many(items)
            except VerifierError:  # some row of the chunk cannot be scored: score them one by one
                verdicts = []
                for item in items:
                    try:
                        verdicts.extend(await pool.verify_many([item]))
                    except VerifierError as exc:
                        verdicts.append(exc)
            for i, verdict in zip(chunk, verdicts):
                out[i] = verdict
        return out
    finally:
        pool.close()
