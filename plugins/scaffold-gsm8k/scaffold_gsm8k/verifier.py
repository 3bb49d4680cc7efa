"""The ``gsm8k`` verifier: reward 1.0 when the response's final answer equals the gold number."""

from __future__ import annotations

from typing import Literal

from scaffold_core.verifier import Reference, Verdict, Verifier, reference_answers

from .answers import AnswerError, canonical_number, extract_answer, gold_answer

#: Keys longer than this are shortened in ``reason`` texts (``extracted`` and ``key`` stay whole).
_REASON_CHARS = 40


def reference_keys(reference: Reference) -> list[str]:
    """The canonical gold numbers of ``reference``: one answer (a string or a number), or a list of
    acceptable ones. Raises ValueError naming the problem when there is none or it is unusable."""
    answers = reference_answers(reference)  # raises for dicts and other shapes
    if not answers:
        raise ValueError("no reference answer: the gsm8k verifier needs the gold number (e.g. '18')")
    return [reference_key(answer) for answer in answers]


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
    together. The reference is a number, a string holding one (or a worked
    solution ending in ``#### <number>``), or a list of acceptable ones. A
    reference without a number raises (the episode fails with the reason)
    instead of silently scoring 0.
    """

    def __init__(self, mode: Literal["strict", "flexible"] = "strict"):
        if mode not in ("strict", "flexible"):
            raise ValueError(f"mode must be 'strict' or 'flexible', got {mode!r}")
        self.mode = mode

    def verify(self, response: str, reference: Reference) -> Verdict:
        golds = reference_keys(reference)
        found = extract_answer(response or "", flexible=self.mode == "flexible")
        if found.key is None:
            return Verdict(0.0, found.text, None, f"no answer: {found.problem}")
        if found.key in golds:
            return Verdict(1.0, found.text, found.key, f"correct ({found.source})")
        expected = " or ".join(_short(g) for g in golds)
        return Verdict(0.0, found.text, found.key,
                       f"wrong answer ({found.source}): got {_short(found.key)}, expected {expected}")

    def __repr__(self) -> str:
        return f"GSM8KVerifier(mode={self.mode!r})"
