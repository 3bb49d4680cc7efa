"""Conformance tests for tasks: rows load, prompts build, the gold answer passes the task's verifier."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, ClassVar

import pytest

from scaffold_core.verifier import reward_range_of

from ._common import ComponentConformance, call_with_deadline, finite_number, short
from .verifiers import _number, _same_answer


class TaskConformance(ComponentConformance):
    """Subclass this in your plugin's tests to check a task against the task contract.

    Set ``name``/``plugin`` (or override :meth:`make_task`); override
    :meth:`gold_response` when the verifier expects more than the bare
    reference (e.g. ``f"#### {reference}"``)::

        class TestMyTask(TaskConformance):
            plugin = scaffold_mytask
            name = "mytask"

    The gold answer is scored by the verifier the task's ``default_config``
    names (``verifier_name`` when it names none). Prompts are rendered with
    :meth:`make_tokenizer` (a dependency-free byte tokenizer with a chat
    template), so no model is needed.
    """

    kind: ClassVar[str] = "task"
    #: How many rows the checks read (a task may have millions).
    max_rows: ClassVar[int] = 50
    #: The verifier that scores the gold answer when ``default_config`` names none.
    verifier_name: ClassVar[str | None] = None
    #: Options of that verifier.
    verifier_options: ClassVar[dict[str, Any]] = {}

    def make_task(self) -> Any:
        """The task under test (default: built by ``name`` through the registry)."""
        return self.build()

    def make_tokenizer(self) -> Any:
        from scaffold_core.tokenizers import ByteTokenizer

        return ByteTokenizer()

    def gold_response(self, row: dict[str, Any], reference: Any) -> str:
        """A response the task's verifier must reward for ``row`` (default: the reference itself; the first
        acceptable answer of a list)."""
        if isinstance(reference, list) and reference:
            reference = reference[0]
        return reference if isinstance(reference, str) else json.dumps(reference)

    def wrong_responses(self, row: dict[str, Any], reference: Any,
                        others: list[tuple[dict[str, Any], Any]]) -> list[str]:
        """Responses the task's verifier must not reward for ``row``: an empty answer, a non-answer, the
        gold response built for an off-by-one numeric reference, and the gold response of another row
        whose answer differs (``others``: (row, reference) of the other rows)."""
        gold = self.gold_response(row, reference)
        out = ["", "I don't know."]
        bumped = _bump(reference)
        if bumped is not None:
            wrong = self.gold_response(row, bumped)
            if wrong != gold:
                out.append(wrong)
        for other_row, other_ref in others:
            if not _same_answer(reference, other_ref):
                wrong = self.gold_response(other_row, other_ref)
                if wrong != gold:
                    out.append(wrong)
                    break
        return out

    def make_verifier(self) -> Any:
        """The task's verifier: ``default_config['verifier']`` (else ``verifier_name``), built by name."""
        section = dict((getattr(self.make_task(), "default_config", None) or {}).get("verifier") or {})
        name = section.pop("name", None) or self.verifier_name
        if name is None:
            pytest.fail("the task's default_config names no verifier: set `verifier_name` in the test class, "
                        "or add default_config = {'verifier': {'name': ...}} to the task")
        from scaffold_core.config import CORE_KEYS  # keys the core's verifier pool takes, not the verifier

        options = {k: v for k, v in section.items() if k not in CORE_KEYS["verifier"]}
        options.update(self.verifier_options)
        return self.scaffold_registry().create("verifier", name, options, path="verifier")

    def some_rows(self) -> list[dict[str, Any]]:
        rows = list(itertools.islice(iter(self.make_task().load()), self.max_rows))
        assert rows, "load() yielded no rows"
        return rows

    # -- tests -----------------------------------------------------------
    def test_rows_load(self) -> None:
        """``load()`` yields dict rows, the same ones each time, with unique ids where ids are given."""
        rows = self.some_rows()
        assert all(isinstance(r, dict) for r in rows), "rows must be dicts"
        assert rows == self.some_rows(), "load() is not repeatable: a resumed run would see other rows"
        ids = [str(r["id"]) for r in rows if "id" in r]
        assert len(ids) == len(set(ids)), "row ids must be unique (they name episodes)"

    def test_prompts_build(self) -> None:
        """Every row renders to a non-empty prompt; ``messages`` (when given) are role/content dicts."""
        task, tokenizer = self.make_task(), self.make_tokenizer()
        for row in self.some_rows():
            prompt = task.build_prompt(row, tokenizer)
            assert prompt.ids and all(isinstance(t, int) for t in prompt.ids), f"empty prompt for row {row}"
            assert isinstance(prompt.text, str) and prompt.text
            for message in prompt.messages or []:
                assert isinstance(message, dict) and "role" in message and "content" in message, message

    def test_references(self) -> None:
        """``reference(row)`` is a JSON value (a string, a number, a list of acceptable answers, a dict) or
        None, and at least one row has one."""
        task = self.make_task()
        refs = [task.reference(row) for row in self.some_rows()]
        for ref in refs:
            try:
                json.loads(json.dumps(ref, allow_nan=False))
            except (TypeError, ValueError) as exc:
                pytest.fail(f"reference(row) returned {ref!r}, which is not a JSON value ({exc}): references are "
                            "written to the run's store and passed to verifiers as JSON", pytrace=False)
        assert any(r is not None for r in refs), "no row has a reference answer"

    def test_gold_answer_passes_the_verifier(self) -> None:
        """The gold response of every row is rewarded by the task's verifier."""
        task, verifier = self.make_task(), self.make_verifier()
        for row in self.some_rows():
            reference = task.reference(row)
            if reference is None:
                continue
            verdict = verifier.verify(self.gold_response(row, reference), reference)
            assert verdict.reward > 0, f"gold answer {reference!r} of row {row} was not rewarded: {verdict}"

    def test_wrong_answers_are_not_rewarded(self) -> None:
        """The all-wrong path: for every row, an empty answer, a non-answer, an off-by-one answer and another
        row's answer are not rewarded by the task's verifier; rewards stay finite and within its range."""
        task, verifier = self.make_task(), self.make_verifier()
        rows = [(row, task.reference(row)) for row in self.some_rows()]
        rows = [(row, ref) for row, ref in rows if ref is not None]
        pairs = [(wrong, ref, row) for i, (row, ref) in enumerate(rows)
                 for wrong in self.wrong_responses(row, ref, rows[i + 1:] + rows[:i])]
        verdicts = _verify_in_pool(verifier, [(w, ref) for w, ref, _ in pairs])
        floor = max(0.0, reward_range_of(verifier)[0])
        for (wrong, ref, row), verdict in zip(pairs, verdicts):
            assert not isinstance(verdict, BaseException), (
                f"the task's verifier raised on the wrong answer {short(wrong)} (reference {short(ref)}): {verdict}. "
                "A wrong or unusable answer must get reward 0, not an error: failed episodes are left out of "
                "the training data, so the model would never see its wrong answers")
            assert verdict.reward <= floor, (
                f"the task's verifier rewarded a wrong answer: {short(wrong)} for reference {short(ref)} (row "
                f"{short(row)}) got {verdict}. Training would reinforce wrong answers: make the verifier compare "
                "the extracted answer with the reference, and check your task's references and gold_response")

    def test_all_wrong_episode_is_completed_with_no_reward(self) -> None:
        """An episode whose every sample is wrong completes (it is training data, not a failure) with reward 0
        on every sample and finite advantages in a group (GRPO over equal rewards)."""
        from scaffold_core.builtins.controllers import NativeController
        from scaffold_core.builtins.trajectories import GRPOTrajectoryMaker
        from scaffold_core.sampling import SamplingParams

        from ..helpers import run_one_episode

        task = self.make_task()
        rows = [(row, task.reference(row)) for row in self.some_rows()]
        rows = [(row, ref) for row, ref in rows if ref is not None]
        row, ref = rows[0]
        wrong = self.wrong_responses(row, ref, rows[1:])
        answer = next((w for w in wrong[2:] if w.strip()), "I don't know.")  # the nearest miss first
        sampling = SamplingParams(max_tokens=len(answer.encode("utf-8")) + 16, temperature=1.0, seed=3)
        result = run_one_episode(task, row, respond=answer, verifier=self.make_verifier(),
                                 controller=NativeController(samples=4), trajectory_maker=GRPOTrajectoryMaker(),
                                 sampling=sampling)
        assert result.ok, (
            f"an episode answering {short(answer)} failed ({result.error_component}: {result.error}); wrong answers "
            "must be scored 0, not fail the episode, or they never reach the training data")
        assert [s.reward for s in result.samples] == [0.0] * 4, (
            f"wrong answer {short(answer)} got rewards {[s.reward for s in result.samples]}")
        for traj in result.trajectories:
            assert finite_number(traj.reward) and finite_number(traj.advantage), traj.to_dict()

    def test_loading_leaves_class_state_unchanged(self) -> None:
        """Loading rows and building prompts changes no class-level container (``default_config`` included)."""
        task = self.make_task()

        def exercise() -> None:
            tokenizer = self.make_tokenizer()
            for row in itertools.islice(iter(task.load()), self.max_rows):
                task.build_prompt(row, tokenizer)
                task.reference(row)

        self.assert_class_state_unchanged(task, exercise, "load(), build_prompt() and reference()")

    def test_default_config_resolves(self) -> None:
        """A config selecting the task by name resolves with the task's defaults."""
        if self.name is None:
            pytest.skip("`name` is not set")
        from scaffold_core.config import load_config

        config = load_config(data={"task": {"name": self.name, **self.options}, "engine": {"name": "benchmark_canned"}},
                             registry=self.scaffold_registry())
        assert config.task.name == self.name

    def test_one_episode_end_to_end(self) -> None:
        """One row runs through the runtime with an engine answering the gold response, and is rewarded."""
        from ..helpers import run_one_episode

        task = self.make_task()
        row = next(r for r in self.some_rows() if task.reference(r) is not None)
        gold = self.gold_response(row, task.reference(row))
        from scaffold_core.sampling import SamplingParams

        sampling = SamplingParams(max_tokens=len(gold.encode("utf-8")) + 16, temperature=0.0)
        result = run_one_episode(task, row, respond=gold, verifier=self.make_verifier(), sampling=sampling)
        assert result.ok, f"{result.error_component}: {result.error}"
        assert result.samples[0].text == gold
        assert (result.samples[0].reward or 0.0) > 0
        assert result.trajectories and result.trajectories[0].reward > 0


def _bump(reference: Any) -> str | None:
    """An off-by-one numeric answer for a numeric reference (``"18"`` -> ``"19"``), else None."""
    if isinstance(reference, list) or isinstance(reference, dict):
        return None
    value = _number(reference)
    if value is None:
        return None
    return str(int(value) + 1) if value == int(value) else str(value + 1)


def _verify_in_pool(verifier: Any, pairs: list[tuple[str, Any]], timeout: float = 30.0) -> list[Any]:
    """Verify through a VerifierPool as the runtime does: a Verdict or the error, per pair."""
    from scaffold_core.run.verifier_pool import VerifierPool

    async def main() -> list[Any]:
        pool = VerifierPool(verifier, timeout=timeout, workers=2, name="task-verifier")
        out: list[Any] = []
        try:
            for pair in pairs:
                try:
                    [verdict] = await pool.verify_many([pair])
                except Exception as exc:
                    out.append(exc)
                    continue
                out.append(verdict)
        finally:
            pool.close()
        return out

    return call_with_deadline(lambda: asyncio.run(main()), timeout * len(pairs) + 30.0, "verification")
