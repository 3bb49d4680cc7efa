"""Built-in verifiers: exact_match (a generic baseline for any task with string answers)."""

from __future__ import annotations

from ..plugins.markers import hookimpl
from ..verifier import Verdict, Verifier


class ExactMatchVerifier(Verifier):
    """Reward 1.0 when the stripped response equals the stripped reference (optionally case-folded)."""

    def __init__(self, ignore_case: bool = False):
        self.ignore_case = ignore_case

    def verify(self, response: str, reference: str | None) -> Verdict:
        answer = response.strip()
        key = answer.casefold() if self.ignore_case else answer
        if not answer:
            return Verdict(0.0, None, None, "empty response")
        if reference is None:
            return Verdict(0.0, answer, key, "no reference")
        ref = reference.strip().casefold() if self.ignore_case else reference.strip()
        ok = key == ref
        return Verdict(1.0 if ok else 0.0, answer, key, "match" if ok else "mismatch")


@hookimpl
def register_verifiers(registry):
    registry.add("exact_match", ExactMatchVerifier)
