"""The ``gsm8k`` verifier: reward 1.0 when the response's final answer equals the gold number."""

from __future__ import annotations

from typing import Literal

from scaffold_core.verifier import Verdict, Verifier

from .answers import AnswerError, canonical_number, extract_answer, gold_answer

#: Keys longer than this are shortened in ``reason`` texts (``extracted`` and ``key`` stay whole).
_REASON_CHARS = 40


def reference_key(reference: str | None) -> str:
    """The canonical gold number of ``reference``: a bare answer ("1,600") or a worked solution ending
    in ``#### <number>``. Raises ValueError naming the problem when there is none."""
    if reference is None:
        raise ValueError("no reference answer: the gsm8k verifier needs the gold number (e.g. '18')")
    try:
        return canonical_number(gold_answer(str(reference)))
    except AnswerError as exc:
        shown = str(reference) if len(str(reference)) <= 80 else str(reference)[:77] + "..."
        raise ValueError(
            f"reference answer {shown!r} is unusable ({exc}); the gsm8k verifier needs one number, "
            "e.g. '18', '1,600' or a worked solution ending in '#### 18'"
        ) from None


def _short(text: str) -> str:
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS - 3] + "..."


class GSM8KVerifier(Verifier):
    """GSM8K answers: the last '####' (else the last \\boxed{}) must hold the gold number.

    ``mode: strict`` (default) gives no reward without a ``####`` or
    ``\\boxed{}`` answer; ``mode: flexible`` then falls back to the last
    number in the response. Numbers compare exactly as rationals. Reward is
    1.0 or 0.0; ``key`` is the canonical number, so "18.00" and "18" vote
    together. A reference without a number raises (the episode fails with the
    reason) instead of silently scoring 0.
    """

    def __init__(self, mode: Literal["strict", "flexible"] = "strict"):
        if mode not in ("strict", "flexible"):
            raise ValueError(f"mode must be 'strict' or 'flexible', got {mode!r}")
        self.mode = mode

    def verify(self, response: str, reference: str | None) -> Verdict:
        gold = reference_key(reference)
        found = extract_answer(response or "", flexible=self.mode == "flexible")
        if found.key is None:
            return Verdict(0.0, found.text, None, f"no answer: {found.problem}")
        if found.key == gold:
            return Verdict(1.0, found.text, found.key, f"correct ({found.source})")
        return Verdict(0.0, found.text, found.key,
                       f"wrong answer ({found.source}): got {_short(found.key)}, expected {_short(gold)}")

    def __repr__(self) -> str:
        return f"GSM8KVerifier(mode={self.mode!r})"
