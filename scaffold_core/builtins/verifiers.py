"""Built-in verifiers: exact_match (a generic baseline for any task with string answers)."""

from __future__ import annotations

from ..plugins.markers import hookimpl
from ..verifier import Reference, Verdict, Verifier, reference_answers


class ExactMatchVerifier(Verifier):
    """Reward 1.0 when the stripped response equals the stripped reference (optionally case-folded).

    The reference may be a string, a number (compared as its text) or a list of acceptable answers
    (any one matches); a dict reference raises (the episode fails with the reason). A row with no
    reference gets an unscored verdict (no reward), never 0.
    """

    def __init__(self, ignore_case: bool = False):
        self.ignore_case = ignore_case

    def _norm(self, text: str) -> str:
        text = text.strip()
        return text.casefold() if self.ignore_case else text

    def verify(self, response: str, reference: Reference) -> Verdict:
        answers = {self._norm(a) for a in reference_answers(reference)} - {""}
        answer = response.strip()
        key = self._norm(answer)
        if not answer:
            return Verdict(0.0, None, None, "empty response")
        if not answers:  # nothing to compare with: no reward, never a 0 that reads as a wrong answer
            return Verdict.unscored("no reference answer to compare with", answer)
        ok = key in answers
        return Verdict(1.0 if ok else 0.0, answer, key, "match" if ok else "mismatch")


@hookimpl
def register_verifiers(registry):
    registry.add("exact_match", ExactMatchVerifier)
