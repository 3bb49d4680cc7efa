"""Conformance tests for verifiers: gold passes, wrong fails, garbage and huge inputs in bounded time."""

from __future__ import annotations

import asyncio
import math
import pickle
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import pytest

from ._common import ComponentConformance, call_with_deadline, short

#: Model output a verifier meets in practice: empty, control characters, special tokens, numbers
#: Python's ``int()`` refuses, unbalanced LaTeX, other scripts' digits.
GARBAGE_RESPONSES: tuple[str, ...] = (
    "", " ", "\n\n\t", "\x00\x01\x02\x7f", "\ufffd" * 16, "\U0001f642\U0001f643" * 32,
    "<|im_end|><|endoftext|>", "NaN", "inf", "-inf", "1e999999", "-", ".", "1/0", "0x1p-1074",
    "(" * 40, "\\boxed{", "\\boxed{}}}}", "$$\\frac{1}{0}$$", "####", "#### ", "The answer is",
    "\u0664\u0662", "\uff19\uff19", "9" * 5000, "1," * 500, "null", "{}", "[]", "'; DROP TABLE x; --",
)


def huge_responses(size: int) -> list[str]:
    """Responses of about ``size`` characters that trip naive parsers (backtracking, int(), recursion)."""
    return [
        "1 " * (size // 2),
        "a" * size,
        "(" * size,
        "\\frac{" * (size // 6),
        "The answer is 7. " * (size // 17),
        "9" * size,
    ]


class VerifierConformance(ComponentConformance):
    """Subclass this in your plugin's tests to check a verifier against the verifier contract.

    Set ``name``/``plugin`` (or override :meth:`make_verifier`) and give at
    least one ``gold`` and one ``wrong`` case::

        class TestMyVerifier(VerifierConformance):
            plugin = scaffold_myplugin
            name = "myverifier"
            gold = [("The answer is 42.", "42")]
            wrong = [("The answer is 41.", "42")]

    Checks run the verifier the way the runtime does (a
    :class:`~scaffold_core.run.verifier_pool.VerifierPool` with the verifier's own
    ``executor``), each call bounded by ``time_limit`` seconds.
    """

    kind: ClassVar[str] = "verifier"
    #: (response, reference) pairs the verifier must reward (reward > 0).
    gold: ClassVar[Sequence[tuple[str, str]]] = ()
    #: (response, reference) pairs the verifier must not reward (reward <= 0).
    wrong: ClassVar[Sequence[tuple[str, str]]] = ()
    #: Seconds one verification may take, garbage and huge inputs included.
    time_limit: ClassVar[float] = 10.0
    #: Characters in the huge inputs.
    huge_size: ClassVar[int] = 1_000_000
    #: Whether the verifier scores against a reference (then a missing one must not be rewarded).
    needs_reference: ClassVar[bool] = True

    def make_verifier(self) -> Any:
        """The verifier under test (default: built by ``name`` through the registry)."""
        return self.build()

    # -- running ---------------------------------------------------------
    def verify_all(self, pairs: Sequence[tuple[str, str | None]], verifier: Any = None) -> list[Any]:
        """Verify each pair as the runtime would; each call must finish within ``time_limit``."""
        from ...run.verifier_pool import VerifierPool
        from ...verifier import Verdict

        verifier = verifier if verifier is not None else self.make_verifier()
        limit = self.time_limit

        async def main() -> list[Any]:
            pool = VerifierPool(verifier, timeout=limit, workers=2, name=self.name or type(verifier).__name__)
            out = []
            try:
                for response, reference in pairs:
                    try:
                        [verdict] = await pool.verify_many([(response, reference)])
                    except Exception as exc:
                        raise AssertionError(
                            f"verify({short(response)}, {short(reference)}) failed: {exc}. A verifier must "
                            f"return a Verdict for any model output within {limit:g} s (reward 0 for "
                            "unusable output), never raise or hang") from exc
                    assert isinstance(verdict, Verdict), f"verify returned {type(verdict).__name__}, not a Verdict"
                    out.append(verdict)
            finally:
                pool.close()
            return out

        # The pool bounds thread and process executors; the deadline also bounds "inline" ones.
        return call_with_deadline(lambda: asyncio.run(main()), limit * len(pairs) + 30.0, "verification")

    # -- tests -----------------------------------------------------------
    def test_executor_is_valid(self) -> None:
        """``executor`` is one of thread/process/inline; a process verifier must pickle."""
        verifier = self.make_verifier()
        executor = getattr(verifier, "executor", "thread")
        assert executor in ("thread", "process", "inline"), (
            f"executor is {executor!r}; use 'thread' (default), 'process' or 'inline'")
        assert callable(getattr(verifier, "verify", None)), "a verifier needs verify(response, reference)"
        if executor == "process":
            pickle.loads(pickle.dumps(verifier))

    def test_gold_passes(self) -> None:
        """Every ``gold`` (response, reference) pair is rewarded."""
        assert self.gold, "set `gold` to (response, reference) pairs the verifier must reward"
        for (response, reference), verdict in zip(self.gold, self.verify_all(self.gold)):
            assert verdict.reward > 0, f"gold {short(response)} vs {short(reference)} got {verdict}"

    def test_wrong_fails(self) -> None:
        """Every ``wrong`` pair gets reward <= 0."""
        assert self.wrong, "set `wrong` to (response, reference) pairs the verifier must not reward"
        for (response, reference), verdict in zip(self.wrong, self.verify_all(self.wrong)):
            assert verdict.reward <= 0, f"wrong {short(response)} vs {short(reference)} was rewarded: {verdict}"

    def test_verdicts_are_well_formed(self) -> None:
        """Rewards are finite numbers; ``extracted``/``key`` are strings or None; ``reason`` a string."""
        pairs = [*self.gold, *self.wrong]
        for (response, _), verdict in zip(pairs, self.verify_all(pairs)):
            assert isinstance(verdict.reward, (int, float)) and not isinstance(verdict.reward, bool)
            assert math.isfinite(verdict.reward), f"reward {verdict.reward!r} for {short(response)}"
            assert verdict.extracted is None or isinstance(verdict.extracted, str)
            assert verdict.key is None or isinstance(verdict.key, str)
            assert isinstance(verdict.reason, str)

    def test_garbage_is_handled(self) -> None:
        """Garbage responses give a Verdict (not an error) with a finite reward, in bounded time."""
        reference = self.gold[0][1] if self.gold else "42"
        pairs: list[tuple[str, str | None]] = [(g, reference) for g in GARBAGE_RESPONSES]
        for (response, _), verdict in zip(pairs, self.verify_all(pairs)):
            assert math.isfinite(verdict.reward), f"reward {verdict.reward!r} for {short(response)}"

    def test_missing_reference_is_not_rewarded(self) -> None:
        """A missing or empty reference is never rewarded: a Verdict with reward <= 0, or an error
        (which fails the episode with the reason; never a silent reward), in bounded time."""
        if not self.needs_reference:
            pytest.skip("needs_reference is False")
        response = self.gold[0][0] if self.gold else "42"
        for reference in (None, "", "   "):
            try:
                [verdict] = self.verify_all([(response, reference)])
            except AssertionError as exc:
                if any(t in str(exc) for t in ("did not finish", "not a Verdict", "expected Verdict")):
                    raise
                continue  # raised: the runtime fails the episode and reports why
            assert verdict.reward <= 0, f"rewarded {short(response)} against reference {reference!r}: {verdict}"

    def test_huge_input_is_bounded(self) -> None:
        """Responses of ``huge_size`` characters are each verified within ``time_limit``."""
        reference = self.gold[0][1] if self.gold else "42"
        pairs = [(h, reference) for h in huge_responses(self.huge_size)]
        for verdict in self.verify_all(pairs):
            assert math.isfinite(verdict.reward)

    def test_deterministic(self) -> None:
        """The same input gets the same verdict every time."""
        pairs = [*self.gold, *self.wrong]
        assert self.verify_all(pairs) == self.verify_all(pairs)

    def test_thread_safe(self) -> None:
        """A thread-executor verifier gives the same verdicts when called from many threads at once."""
        verifier = self.make_verifier()
        if getattr(verifier, "executor", "thread") != "thread":
            pytest.skip("only thread-executor verifiers are called from several threads")
        pairs = [*self.gold, *self.wrong] * 8
        expected = [verifier.verify(r, ref) for r, ref in pairs]

        def concurrent() -> list[Any]:
            with ThreadPoolExecutor(max_workers=8) as pool:
                return list(pool.map(lambda p: verifier.verify(*p), pairs))

        got = call_with_deadline(concurrent, self.time_limit * len(pairs) + 30.0, "concurrent verification")
        assert got == expected, "verdicts differ when verify() runs in several threads: keep no per-call state on self"
