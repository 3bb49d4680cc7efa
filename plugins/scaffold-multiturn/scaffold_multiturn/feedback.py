"""The ``verifier_feedback`` environment: check each answer with the run's verifier; when wrong, ask again."""

from __future__ import annotations

from typing import Any

from scaffold_core.environment import Environment, EnvStep
from scaffold_core.generation import VerificationTask

DEFAULT_WRONG = "That answer is not correct. Check your work and try again."
DEFAULT_MISSING = "I could not find a final answer in your reply. Try again and state your final answer clearly."


class VerifierFeedbackEnvironment(Environment):
    """Scores each assistant turn with the run's verifier; ends when it is right, else asks for another try.

    The reply says only that the answer was wrong (``wrong_message``) or
    that no answer was found (``missing_message``): never the reference, and
    never the verifier's reason (which may name the expected answer).
    ``{answer}`` in ``wrong_message`` is replaced by the answer the verifier
    extracted from the response. Each turn's reward is the verifier's reward
    for that turn.
    """

    def __init__(self, wrong_message: str = DEFAULT_WRONG, missing_message: str | None = DEFAULT_MISSING):
        if not wrong_message.strip():
            raise ValueError("wrong_message must not be empty: it is the reply the model reads after a wrong answer")
        if missing_message is not None and not missing_message.strip():
            raise ValueError("missing_message must not be empty (null uses wrong_message)")
        self.wrong_message = wrong_message
        self.missing_message = missing_message

    def reset(self, ctx: Any) -> dict[str, Any]:
        return {"reference": ctx.reference}

    def step(self, state: dict[str, Any], response: str):
        check = VerificationTask(response, state["reference"])
        yield [check]
        verdict = check.need_verdict()
        if verdict.correct:
            return EnvStep.finish(reward=verdict.reward, verdict=verdict)
        if verdict.extracted is None and self.missing_message is not None:
            text = self.missing_message
        else:
            text = self.wrong_message.replace("{answer}", verdict.extracted or "")
        return EnvStep.reply(text, reward=verdict.reward, verdict=verdict)
