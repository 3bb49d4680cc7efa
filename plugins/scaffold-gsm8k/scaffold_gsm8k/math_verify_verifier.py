"""The ``math_verify`` verifier: symbolic comparison with Hugging Face's math-verify (optional extra).

It finds the final answer with the same anchored policy as the ``gsm8k``
verifier (the last ``####``, else the last ``\\boxed{}``; never "any number
anywhere"), then lets math-verify decide whether that answer equals the gold
one, so equivalent forms such as ``\\frac{36}{2}`` or ``2 \\cdot 9`` also
score.

math-verify bounds its own work with ``signal.alarm``, which only works on a
process's main thread. This verifier therefore declares ``executor =
"process"``: the core runs it in worker processes (where it is on the main
thread) and kills a worker that exceeds ``verifier.timeout``. Called from any
other thread, it turns math-verify's own timeouts off and relies on the
caller's bound.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from scaffold_core.errors import MissingDependencyError
from scaffold_core.verifier import Reference, Verdict, Verifier, reference_answers

from .answers import extract_answer, gold_answer

INSTALL_HINT = 'pip install "math-verify>=0.7" (what the math-verify extra of scaffold-gsm8k adds)'


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as exc:
        raise MissingDependencyError(f"the math_verify verifier needs math-verify ({exc}); {INSTALL_HINT}") from exc
    return math_verify


class MathVerifyVerifier(Verifier):
    """math-verify on the final answer (last '####', else last \\boxed{}): symbolic equality with the gold."""

    executor: ClassVar[str] = "process"

    def __init__(self, timeout_s: int = 5, max_answer_chars: int = 1000, float_rounding: int = 6):
        if timeout_s < 1:
            raise ValueError(f"timeout_s must be >= 1 (math-verify counts whole seconds), got {timeout_s}")
        if max_answer_chars < 1:
            raise ValueError(f"max_answer_chars must be >= 1, got {max_answer_chars}")
        self.timeout_s = timeout_s
        self.max_answer_chars = max_answer_chars
        self.float_rounding = float_rounding

    def _timeout(self) -> int | None:
        return self.timeout_s if threading.current_thread() is threading.main_thread() else None

    def verify(self, response: str, reference: Reference) -> Verdict:
        mv = _math_verify()
        answers = reference_answers(reference)  # one answer or a list of acceptable ones; raises for dicts
        if not answers:
            raise ValueError("no reference answer: the math_verify verifier needs the gold answer")
        timeout = self._timeout()
        golds = []
        for answer in answers:
            gold_text = gold_answer(answer)
            gold = mv.parse(gold_text, parsing_timeout=timeout)
            if not gold:
                raise ValueError(f"reference answer {gold_text[:80]!r} cannot be parsed by math-verify")
            golds.append(gold)
        found = extract_answer(response or "")
        if not found.text:
            problem = found.problem or "no answer"
            return Verdict(0.0, found.text, None, f"no answer: {problem}")
        if len(found.text) > self.max_answer_chars:
            return Verdict(0.0, found.text, None,
                           f"no answer: the answer is longer than {self.max_answer_chars} characters")
        parsed = mv.parse(found.text, parsing_timeout=timeout)
        if not parsed:
            return Verdict(0.0, found.text, None, f"no answer: math-verify cannot parse the {found.source} answer")
        key = found.key if found.key is not None else str(parsed[0])  # canonical numbers vote together
        ok = any(mv.verify(gold, parsed, float_rounding=self.float_rounding, timeout_seconds=timeout)
                 for gold in golds)
        return Verdict(1.0 if ok else 0.0, found.text, key,
                       f"correct ({found.source})" if ok else f"wrong answer ({found.source}): got {key[:40]}")
