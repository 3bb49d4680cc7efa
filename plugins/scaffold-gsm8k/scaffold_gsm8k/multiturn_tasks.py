"""GSM8K for multi-turn controllers: ``multiturn_gsm8k`` (retried in conversation while the answer is wrong) and
``gsm8k_calculator`` (solved with the calculator tool).

The tasks only name the components they run with (scaffold-multiturn's ``multiturn_chat`` and ``agent``
controllers, its ``verifier_feedback`` environment and ``multiturn`` trajectory maker, scaffold-tools'
``calculator``): nothing here imports another plugin, and a run that lacks one says which to install.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from .task import GSM8KTask

#: What the environment says after a wrong answer: that it is wrong, never what is right.
WRONG_MESSAGE = ("Your final answer {answer} is not correct. Go through the problem again step by step, "
                 "then write the corrected final answer on the last line after '####'.")
MISSING_MESSAGE = ("I could not find your final answer. Solve the problem step by step, then write the final "
                   "answer, a number only, on the last line after '####'.")


class MultiTurnGSM8KTask(GSM8KTask):
    """GSM8K as a conversation: after a wrong answer the user says so and asks for another try.

    Rows, prompts and options are those of the ``gsm8k`` task (``source:
    sample`` for the bundled offline sample, ``data_files`` for local files,
    the hub by default). The defaults run the ``multiturn_chat`` controller
    with the ``verifier_feedback`` environment for up to 3 turns; the gsm8k
    verifier scores the last answer and the reward is discounted by
    ``turn_discount`` (0.5) for each extra turn: 1.0 right first time, 0.5 on
    the second try, 0.25 on the third.
    """

    default_config: ClassVar[dict[str, Any]] = {
        "sampling": {"max_tokens": 512, "temperature": 1.0},
        "verifier": {"name": "gsm8k"},
        "controller": {
            "name": "multiturn_chat",
            "max_turns": 3,
            "turn_discount": 0.5,
            "environment": {"name": "verifier_feedback", "wrong_message": WRONG_MESSAGE,
                            "missing_message": MISSING_MESSAGE},
        },
        "trajectory": {"name": "multiturn"},
    }


#: The calculator task's system prompt and instruction: use the tool for arithmetic, answer after '####'.
CALCULATOR_SYSTEM_PROMPT = ("You are a careful math tutor. You solve grade-school math word problems step by step, "
                            "and you use the calculator tool for every calculation instead of doing it in your head.")
CALCULATOR_INSTRUCTION = (
    "{question}\n\n"
    "Work step by step, and call the calculator for each calculation. When you know the answer, reply without a "
    "tool call and write the final answer, a number only, on the last line after '####', like this:\n#### <number>"
)


class GSM8KCalculatorTask(GSM8KTask):
    """GSM8K with a calculator: the ``agent`` controller lets the model call the ``calculator`` tool.

    Rows, data sources and options are those of the ``gsm8k`` task; the
    system prompt and instruction ask for the calculator and a final answer
    after ``####``. The defaults run the ``agent`` controller with the
    ``calculator`` tool (from scaffold-tools) in the ``hermes`` format, up to 4
    model turns, scored by the gsm8k verifier on the final answer; the
    ``multiturn`` trajectory maker keeps the tool results out of the loss.
    """

    default_config: ClassVar[dict[str, Any]] = {
        "sampling": {"max_tokens": 256, "temperature": 1.0},
        "verifier": {"name": "gsm8k"},
        "controller": {"name": "agent", "tools": ["calculator"], "format": "hermes", "max_turns": 4},
        "trajectory": {"name": "multiturn"},
    }

    def __init__(
        self,
        source: Literal["hub", "sample"] = "hub",
        split: str = "test",
        data_files: str | list[str] | dict[str, str | list[str]] | None = None,
        limit: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        system_prompt: str | None = CALCULATOR_SYSTEM_PROMPT,
        instruction: str = CALCULATOR_INSTRUCTION,
        few_shot: int = 0,
        few_shot_file: str | None = None,
        cache_dir: str | None = None,
    ):
        super().__init__(source=source, split=split, data_files=data_files, limit=limit, shuffle=shuffle, seed=seed,
                         system_prompt=system_prompt, instruction=instruction, few_shot=few_shot,
                         few_shot_file=few_shot_file, cache_dir=cache_dir)
