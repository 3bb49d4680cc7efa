"""The ``multiturn_gsm8k`` task: GSM8K problems, retried in conversation while the answer is wrong."""

from __future__ import annotations

from typing import Any, ClassVar

from scaffold_gsm8k.task import GSM8KTask

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
