"""Built-in verifiers: exact_match (a generic baseline for any task with string answers)."""

from __future__ import annotations

from ..hookimpl import hookimpl
from ..verifier import ExactMatchVerifier


@hookimpl
def register_verifiers(registry):
    registry.add("exact_match", ExactMatchVerifier)
