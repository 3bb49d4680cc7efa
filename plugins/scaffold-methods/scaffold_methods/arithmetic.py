"""The ``small_arithmetic`` task and verifier: small sums made from a seed, no data files.

A row asks ``What is 7 + 5?`` (``operands`` numbers of ``digits`` digits
each, joined by the ``operations``), with the instruction to think step by
step and write the answer after ``####``. The rows are the same for the same
options on every machine. With one-digit sums the bundled SmolLM2-135M
answers 20% to 40% of them correctly at temperature 0.7 and 64 tokens (several
runs of ``bench/scaling_methods.py``), the range where inference-time methods
have room to help.

The ``small_arithmetic`` verifier reads the integer after the last ``####``, else
the last integer in the response (small models often forget the marker);
reward 1.0 when it equals the reference. Its key is the canonical integer,
so "1,200" and "1200" vote together.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Le

from scaffold_core.plugins import Help
from scaffold_core.task import Task
from scaffold_core.verifier import Reference, Verdict, Verifier, reference_answers

DEFAULT_INSTRUCTION = "{question} Think step by step, then give the final answer after ####."
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
#: How much of a response the verifier reads (the answer is at its end), and the longest integer it accepts.
TAIL_CHARS = 10_000
MAX_DIGITS = 30
_MARKED = re.compile(r"####\s*(-?\d[\d,]*)")
_NUMBER = re.compile(r"-?\d[\d,]*")


class ArithmeticTask(Task):
    """Small arithmetic questions made from ``seed`` (see the module docstring)."""

    default_config: ClassVar[dict[str, Any]] = {
        "sampling": {"max_tokens": 96, "temperature": 0.7},
        "verifier": {"name": "small_arithmetic"},
    }

    def __init__(self, count: Annotated[int, Ge(1), Help("problems")] = 200,
                 digits: Annotated[int, Ge(1), Le(9), Help("digits of an operand")] = 1,
                 operands: Annotated[int, Ge(2), Le(6), Help("operands of a problem")] = 2,
                 operations: Sequence[str] = ("+",),
                 seed: int = 0, instruction: str = DEFAULT_INSTRUCTION, system_prompt: str | None = None):
        super().__init__()
        unknown = [op for op in operations if op not in _OPS]
        if unknown or not operations:
            raise ValueError(f"operations must be a non-empty list of {sorted(_OPS)}, got {list(operations)!r}")
        if "{question}" not in instruction:
            raise ValueError("instruction must contain {question} where the question goes")
        self.count, self.digits, self.operands = count, digits, operands
        self.operations, self.seed = tuple(operations), seed
        self.instruction, self.system_prompt = instruction, system_prompt

    def load(self) -> Iterable[dict[str, Any]]:
        rng = random.Random(f"arithmetic/{self.seed}/{self.digits}/{self.operands}/{''.join(self.operations)}")
        low, high = (1, 9) if self.digits == 1 else (10 ** (self.digits - 1), 10 ** self.digits - 1)
        for i in range(self.count):
            numbers = [rng.randint(low, high) for _ in range(self.operands)]
            ops = [rng.choice(self.operations) for _ in range(self.operands - 1)]
            value = numbers[0]
            for op, number in zip(ops, numbers[1:]):  # left to right, as written (no precedence with '*')
                value = _OPS[op](value, number)
            text = " ".join([str(numbers[0])] + [f"{op} {n}" for op, n in zip(ops, numbers[1:])])
            yield {"id": f"arith-{i}", "question": f"What is {text}?", "answer": str(value)}

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        content = self.instruction.replace("{question}", str(row["question"]))
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": content}]

    def reference(self, row: dict[str, Any]) -> Reference:
        return str(row["answer"])


def extract_integer(text: str) -> tuple[str | None, str]:
    """(the canonical answer integer or None, where it came from): after the last ``####``, else the last integer."""
    tail = (text or "")[-TAIL_CHARS:]
    marked = _MARKED.findall(tail)
    found, source = (marked[-1], "####") if marked else (None, "")
    if found is None:
        numbers = _NUMBER.findall(tail)
        found, source = (numbers[-1], "last number") if numbers else (None, "")
    if found is None:
        return None, "no number"
    digits = found.replace(",", "")
    if digits in ("", "-") or len(digits.lstrip("-")) > MAX_DIGITS:
        return None, "no usable number"
    return str(int(digits)), source


class ArithmeticVerifier(Verifier):
    """Reward 1.0 when the response's final integer equals the reference (see the module docstring)."""

    executor: ClassVar[str] = "inline"

    def verify(self, response: str, reference: Reference) -> Verdict:
        golds = set()
        for answer in reference_answers(reference):
            key, _ = extract_integer(answer)
            if key is None:
                raise ValueError(f"reference {answer!r} is not an integer; the arithmetic verifier compares integers")
            golds.add(key)
        if not golds:
            raise ValueError("no reference answer: the arithmetic verifier needs the gold integer (e.g. '12')")
        key, source = extract_integer(response)
        if key is None:
            return Verdict(0.0, None, None, source)
        ok = key in golds
        return Verdict(1.0 if ok else 0.0, key, key, f"{'correct' if ok else 'wrong'} ({source})")
