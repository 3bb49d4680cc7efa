"""``scaffold score``: re-score saved responses with any installed verifier."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from ..config import parse_override
from ..errors import ConfigError
from ..plugins import get_registry
from .verifier_pool import VerifierPool

CHUNK = 512


def score_file(verifier_name: str, input_path: str, output_path: str | None = None,
               options: list[str] | None = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """Score every line of ``input_path`` (fields ``response`` and ``answer``; others are kept).

    ``answer`` is the reference, any JSON value (a string, a number, a list of acceptable answers,
    a dict the verifier understands, or null), passed to the verifier as it is.
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
    for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{input_path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(row, dict) or "response" not in row or "answer" not in row:
            raise ConfigError(f"{input_path}:{number}: each line needs 'response' and 'answer' fields")
        rows.append(row)
    verdicts = asyncio.run(_score(verifier, verifier_name, rows, timeout))
    correct = 0
    for row, verdict in zip(rows, verdicts):
        row["reward"] = verdict.reward
        row["extracted"] = verdict.extracted
        row["reason"] = verdict.reason
        correct += verdict.reward > 0
    if output_path:
        target = Path(output_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    n = len(rows)
    return {
        "input": str(source),
        "verifier": verifier_name,
        "lines": n,
        "correct": correct,
        "accuracy": round(correct / n, 6) if n else 0.0,
        "reward_mean": round(sum(r["reward"] for r in rows) / n, 6) if n else 0.0,
        **({"output": output_path} if output_path else {}),
    }


async def _score(verifier: Any, name: str, rows: list[dict[str, Any]], timeout: float) -> list[Any]:
    pool = VerifierPool(verifier, timeout=timeout, workers=2, name=name)
    try:
        out: list[Any] = []
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start:start + CHUNK]
            out.extend(await pool.verify_many([(str(r["response"]), r["answer"]) for r in chunk]))
        return out
    finally:
        pool.close()
