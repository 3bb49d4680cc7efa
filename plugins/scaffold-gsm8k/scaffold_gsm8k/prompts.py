"""The chat messages of a GSM8K prompt: system prompt, optional few-shot turns, the question.

The runtime renders them with the engine tokenizer's chat template.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

DEFAULT_SYSTEM_PROMPT = "You are a careful math tutor. You solve grade-school math word problems step by step."
DEFAULT_INSTRUCTION = (
    "{question}\n\n"
    "Think step by step. Then write the final answer, a number only, on the last line after '####', "
    "like this:\n#### <number>"
)
QUESTION_FIELD = "{question}"

_CALCULATOR = re.compile(r"<<[^<>]*>>")


def check_instruction(instruction: str) -> str:
    """Return ``instruction`` if it holds the ``{question}`` placeholder, else raise ValueError."""
    if QUESTION_FIELD not in instruction:
        raise ValueError(
            f"instruction must contain {QUESTION_FIELD} where the problem goes, e.g. "
            f"'{QUESTION_FIELD}\\n\\nGive the final answer after ####.'")
    return instruction


def render_instruction(instruction: str, question: str) -> str:
    """The user turn for ``question`` (a plain replacement: braces in the text are safe)."""
    return instruction.replace(QUESTION_FIELD, question.strip())


def worked_answer(answer: str) -> str:
    """A GSM8K worked solution without its ``<<calculator>>`` annotations, for few-shot turns."""
    return _CALCULATOR.sub("", answer).strip()


def build_messages(question: str, *, system_prompt: str | None, instruction: str,
                   examples: Sequence[dict[str, Any]] = ()) -> list[dict[str, str]]:
    """System prompt (if any), one user/assistant pair per example, then the question."""
    messages: list[dict[str, str]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    for example in examples:
        messages.append({"role": "user", "content": render_instruction(instruction, example["question"])})
        messages.append({"role": "assistant", "content": worked_answer(example["answer"])})
    messages.append({"role": "user", "content": render_instruction(instruction, question)})
    return messages
