"""Conformance tests for verifiers: gold passes, wrong fails, rewards in range, garbage and huge inputs bounded."""

from __future__ import annotations

import asyncio
import math
import pickle
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import pytest

from scaffold_core.verifier import Reference

from ._common import ComponentConformance, call_with_deadline, finite_number, least_block, short

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


#: A response no verifier should reward: the answer is not there.
NO_ANSWER = "I don't know."
#: A reference no response in the kit's cases answers.
DECOY = "__scaffold_decoy_answer_7f3a__"


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
    ``executor``), each call bounded by ``time_limit`` seconds. Every reward
    the kit sees must be a finite number within the verifier's declared
    ``reward_range`` (default ``(0.0, 1.0)``). Beyond your ``wrong`` cases,
    the kit derives wrong answers of its own (an empty answer, a non-answer,
    each gold response against another case's reference) and structured
    references (lists, dicts, numbers) of wrong answers: none may be rewarded.
    """

    kind: ClassVar[str] = "verifier"
    #: (response, reference) pairs the verifier must reward (reward > 0). A reference is any JSON value.
    gold: ClassVar[Sequence[tuple[str, Reference]]] = ()
    #: (response, reference) pairs the verifier must not reward (reward <= 0).
    wrong: ClassVar[Sequence[tuple[str, Reference]]] = ()
    #: Seconds one verification may take, garbage and huge inputs included.
    time_limit: ClassVar[float] = 10.0
    #: Characters in the huge inputs.
    huge_size: ClassVar[int] = 1_000_000
    #: Whether the verifier scores against a reference (then a missing one must not be rewarded).
    needs_reference: ClassVar[bool] = True
    #: Whether a list reference means "any of these answers" to this verifier (then it is checked that
    #: a gold response passes against [other, gold]); ``False``: lists need not be understood, only
    #: never rewarded wrongly (raising is fine: the episode fails with the reason).
    list_references: ClassVar[bool] = False

    def make_verifier(self) -> Any:
        """The verifier under test (default: built by ``name`` through the registry)."""
        return self.build()

    # -- running ---------------------------------------------------------
    def verify_each(self, pairs: Sequence[tuple[str, Reference]], verifier: Any = None) -> list[Any]:
        """Verify each pair as the runtime would: a Verdict, or the exception the verifier raised (which
        fails the episode with its reason). Hangs, invalid verdicts and out-of-range rewards fail the test."""
        from scaffold_core.errors import VerifierError
        from scaffold_core.run.verifier_pool import VerifierPool

        verifier = verifier if verifier is not None else self.make_verifier()
        limit = self.time_limit

        async def main() -> list[Any]:
            pool = VerifierPool(verifier, timeout=limit, workers=2, name=self.name or type(verifier).__name__)
            out: list[Any] = []
            try:
                for response, reference in pairs:
                    try:
                        [verdict] = await pool.verify_many([(response, reference)])
                    except VerifierError as exc:
                        text = str(exc)
                        if "reward_range" in text or "expected Verdict" in text:
                            pytest.fail(f"invalid verdict for verify({short(response)}, {short(reference)}): {text}",
                                        pytrace=False)
                        if "did not finish within" in text:
                            pytest.fail(f"verify({short(response)}, {short(reference)}) {text}. A verifier must "
                                        f"answer any model output within {limit:g} s (time_limit): bound the work "
                                        "on long inputs (look at the tail, cap regex backtracking)", pytrace=False)
                        out.append(exc)
                        continue
                    out.append(verdict)
            finally:
                pool.close()
            return out

        # The pool bounds thread and process executors; the deadline also bounds "inline" ones.
        return call_with_deadline(lambda: asyncio.run(main()), limit * len(pairs) + 30.0, "verification")

    def verify_all(self, pairs: Sequence[tuple[str, Reference]], verifier: Any = None) -> list[Any]:
        """Verify each pair as the runtime would; every one must give a Verdict within ``time_limit``."""
        out = self.verify_each(pairs, verifier)
        for (response, reference), got in zip(pairs, out):
            if isinstance(got, BaseException):
                raise AssertionError(
                    f"verify({short(response)}, {short(reference)}) failed: {got}. A verifier must "
                    f"return a Verdict for any model output within {self.time_limit:g} s (reward 0 for "
                    "unusable output), never raise or hang") from got
        return out

    def reward_range(self) -> tuple[float, float]:
        from scaffold_core.verifier import reward_range_of

        return reward_range_of(self.make_verifier())

    def not_rewarded(self, verdict: Any) -> bool:
        """Whether a verdict gives no reward: unscored (:meth:`Verdict.unscored`), or ``reward <= 0`` (or the
        range's floor, when that is higher)."""
        return not verdict.scored or verdict.reward <= max(0.0, self.reward_range()[0])

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
            assert self.not_rewarded(verdict), (
                f"wrong {short(response)} vs {short(reference)} was rewarded: {verdict}")

    def test_verdicts_are_well_formed(self) -> None:
        """Rewards are finite numbers; ``extracted``/``key`` are strings or None; ``reason`` a string."""
        pairs = [*self.gold, *self.wrong]
        for (response, _), verdict in zip(pairs, self.verify_all(pairs)):
            assert isinstance(verdict.reward, (int, float)) and not isinstance(verdict.reward, bool)
            assert math.isfinite(verdict.reward), f"reward {verdict.reward!r} for {short(response)}"
            assert verdict.extracted is None or isinstance(verdict.extracted, str)
            assert verdict.key is None or isinstance(verdict.key, str)
            assert isinstance(verdict.reason, str)

    def test_reward_range_is_declared_well(self) -> None:
        """``reward_range`` (default ``(0.0, 1.0)``) is two finite numbers, low < high, and gold is rewarded
        above zero within it."""
        try:
            low, high = self.reward_range()
        except ValueError as exc:
            pytest.fail(str(exc), pytrace=False)
        assert high > 0, f"reward_range ({low:g}, {high:g}) leaves no positive reward for a right answer"

    def test_rewards_are_finite_and_within_reward_range(self) -> None:
        """Gold, wrong, empty, non-answers and garbage all get finite rewards within ``reward_range``
        (a NaN or out-of-range reward would poison a training batch; the runtime fails such episodes)."""
        low, high = self.reward_range()
        reference = self.gold[0][1] if self.gold else "42"
        pairs = [*self.gold, *self.wrong, ("", reference), (NO_ANSWER, reference),
                 *((g, reference) for g in GARBAGE_RESPONSES)]
        for (response, ref), got in zip(pairs, self.verify_each(pairs)):
            if isinstance(got, BaseException):
                continue  # raising is judged by the garbage and gold checks
            assert finite_number(got.reward) and low <= got.reward <= high, (
                f"reward {got.reward!r} for {short(response)} vs {short(ref)} is outside reward_range "
                f"({low:g}, {high:g}): return rewards within the range, or declare the range the verifier uses "
                "as a class attribute, reward_range = (low, high)")

    def test_wrong_answers_are_not_rewarded(self) -> None:
        """The all-wrong path: an empty answer, a non-answer, and each gold response checked against another
        case's (different) reference are never rewarded, whatever ``wrong`` lists."""
        pairs = self.derived_wrong()
        assert pairs, "set `gold` to (response, reference) pairs: wrong answers are derived from them"
        for (response, reference), verdict in zip(pairs, self.verify_all(pairs)):
            assert self.not_rewarded(verdict), (
                f"a wrong answer was rewarded: verify({short(response)}, {short(reference)}) gave {verdict}. "
                "A verifier that rewards wrong answers trains the model on them: compare the extracted answer "
                "with the reference, and give no reward when they differ or no answer is found")

    def derived_wrong(self) -> list[tuple[str, Reference]]:
        """Wrong (response, reference) pairs derived from ``gold``."""
        pairs: list[tuple[str, Reference]] = []
        for response, reference in self.gold:
            pairs += [("", reference), (NO_ANSWER, reference), ("   \n", reference)]
            for _, other in self.gold:
                if not _same_answer(reference, other):
                    pairs.append((response, other))
                    break
        return pairs

    def test_structured_references_are_handled(self) -> None:
        """References of other JSON shapes (a list, a dict, a number, a boolean) are either understood or
        refused with an error (the episode fails with the reason): never a wrong answer rewarded."""
        if not self.gold:
            pytest.skip("no gold cases")
        for response, reference in self.gold:
            decoy = _decoy(reference, [o for _, o in self.gold])
            # none holds the answer: a list of wrong answers, a dict whose answer is wrong (the right one
            # listed as rejected: text search through str(dict) would find it), a boolean, a nested list
            decoys: list[Reference] = [[decoy], {"answer": decoy, "rejected": [reference]}, True, [[decoy]]]
            if isinstance(reference, str) and not _number(reference) and not _number(decoy):
                decoys.append(987654321)
            for ref, got in zip(decoys, self.verify_each([(response, r) for r in decoys])):
                if isinstance(got, BaseException):
                    continue  # refused: the episode fails with the reason
                assert self.not_rewarded(got), (
                    f"verify({short(response)}, {short(ref)}) rewarded a reference of another shape that does not "
                    f"hold the answer: {got}. Read structured references as what they are (a list: acceptable "
                    "answers; see scaffold_core.verifier.reference_answers), or raise ValueError naming the shape "
                    "you cannot use; never turn them into text with str()")
            if self.list_references and isinstance(reference, (str, int, float)):
                [got] = self.verify_all([(response, [decoy, reference])])
                assert got.reward > 0, (
                    f"list_references is True, but gold {short(response)} against [{decoy!r}, {reference!r}] "
                    f"got {got}: a list reference means any of its answers is right")

    def test_garbage_is_handled(self) -> None:
        """Garbage responses give a Verdict (not an error) with a finite reward, in bounded time."""
        reference = self.gold[0][1] if self.gold else "42"
        pairs: list[tuple[str, Reference]] = [(g, reference) for g in GARBAGE_RESPONSES]
        for (response, _), verdict in zip(pairs, self.verify_all(pairs)):
            assert math.isfinite(verdict.reward), f"reward {verdict.reward!r} for {short(response)}"

    def test_missing_reference_is_not_rewarded(self) -> None:
        """A missing or empty reference is never rewarded: a Verdict with reward <= 0, or an error
        (which fails the episode with the reason; never a silent reward), in bounded time."""
        if not self.needs_reference:
            pytest.skip("needs_reference is False")
        response = self.gold[0][0] if self.gold else "42"
        missing: list[Reference] = [None, "", "   ", []]
        for reference, got in zip(missing, self.verify_each([(response, r) for r in missing])):
            if isinstance(got, BaseException):
                continue  # raised: the runtime fails the episode and reports why
            assert self.not_rewarded(got), f"rewarded {short(response)} against reference {reference!r}: {got}"

    def test_huge_input_is_bounded(self) -> None:
        """Responses of ``huge_size`` characters are each verified within ``time_limit``, rewards in range."""
        low, high = self.reward_range()
        reference = self.gold[0][1] if self.gold else "42"
        pairs = [(h, reference) for h in huge_responses(self.huge_size)]
        for verdict in self.verify_all(pairs):
            assert finite_number(verdict.reward) and low <= verdict.reward <= high

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

    def test_inline_verifier_does_not_block_the_event_loop(self) -> None:
        """An ``executor = "inline"`` verifier runs on the event loop: each call, huge inputs included, must
        return within ``max_loop_block`` seconds, or every episode of the run stalls meanwhile."""
        verifier = self.make_verifier()
        if getattr(verifier, "executor", "thread") != "inline":
            pytest.skip("only inline verifiers run on the event loop")
        reference = self.gold[0][1] if self.gold else "42"
        pairs = [*self.gold, *self.wrong, *((g, reference) for g in GARBAGE_RESPONSES),
                 *((h, reference) for h in huge_responses(self.huge_size))]

        async def main() -> float:
            from scaffold_core.run.verifier_pool import VerifierPool

            from ..live import LoopLagMonitor

            pool = VerifierPool(verifier, timeout=self.time_limit, workers=1, name="inline")
            try:
                async with LoopLagMonitor() as lag:
                    for pair in pairs:
                        try:
                            await pool.verify_many([pair])
                        except Exception:
                            pass  # errors are judged elsewhere
                        await asyncio.sleep(0)
                return lag.max_block
            finally:
                pool.close()

        blocked = least_block(lambda: call_with_deadline(lambda: asyncio.run(main()),
                                                         self.time_limit * len(pairs) + 30.0, "verification"),
                              self.max_loop_block)
        assert blocked <= self.max_loop_block, (
            f"the inline verifier held the event loop for {blocked:.3f} s in one call (bound: max_loop_block = "
            f"{self.max_loop_block:g} s): every episode stalls meanwhile. Use executor = 'thread' (the default) or "
            "'process', or make verify() fast on every input")

    def test_calls_leave_class_state_unchanged(self) -> None:
        """Verifying changes no class-level container of the verifier's classes."""
        verifier = self.make_verifier()
        reference = self.gold[0][1] if self.gold else "42"
        pairs = [*self.gold, *self.wrong, *((g, reference) for g in GARBAGE_RESPONSES[:8])]
        self.assert_class_state_unchanged(verifier, lambda: self.verify_each(pairs, verifier), "verify()")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip().replace(",", ""))
    except ValueError:
        return None


def _decoy(reference: Any, others: list[Any]) -> Any:
    """A wrong answer of the reference's kind: another case's reference, else the number plus 1000."""
    other = next((o for o in others if not isinstance(o, (list, dict)) and not _same_answer(reference, o)), None)
    if other is not None:
        return other
    value = None if isinstance(reference, (list, dict)) else _number(reference)
    if value is not None:
        return str(int(value) + 1000) if value == int(value) else str(value + 1000)
    return DECOY


def _same_answer(a: Any, b: Any) -> bool:
    """Whether two references may share an answer (then one cannot serve as a wrong one for the other):
    equal, numerically equal, equal ignoring case, or lists with such an element in common."""
    if a == b:
        return True
    if isinstance(a, list) or isinstance(b, list):
        return any(_same_answer(x, y) for x in (a if isinstance(a, list) else [a])
                   for y in (b if isinstance(b, list) else [b]))
    if isinstance(a, dict) or isinstance(b, dict):
        return str(a) == str(b)
    x, y = _number(a), _number(b)
    if x is not None and y is not None:
        return x == y
    return str(a).strip().casefold() == str(b).strip().casefold()
