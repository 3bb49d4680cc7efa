"""Conformance tests for tasks: rows load, prompts build, the gold answer passes the task's verifier."""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import pytest

from ._common import ComponentConformance


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
        from ...tokenizers import ByteTokenizer

        return ByteTokenizer()

    def gold_response(self, row: dict[str, Any], reference: str) -> str:
        """A response the task's verifier must reward for ``row`` (default: the reference itself)."""
        return reference

    def make_verifier(self) -> Any:
        """The task's verifier: ``default_config['verifier']`` (else ``verifier_name``), built by name."""
        section = dict((getattr(self.make_task(), "default_config", None) or {}).get("verifier") or {})
        name = section.pop("name", None) or self.verifier_name
        if name is None:
            pytest.fail("the task's default_config names no verifier: set `verifier_name` in the test class, "
                        "or add default_config = {'verifier': {'name': ...}} to the task")
        from ...config import CORE_KEYS  # keys the core's verifier pool takes, not the verifier

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
        """``reference(row)`` is a string or None, and at least one row has one."""
        task = self.make_task()
        refs = [task.reference(row) for row in self.some_rows()]
        assert all(r is None or isinstance(r, str) for r in refs), "reference(row) must return str or None"
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

    def test_default_config_resolves(self) -> None:
        """A config selecting the task by name resolves with the task's defaults."""
        if self.name is None:
            pytest.skip("`name` is not set")
        from ...config import load_config

        config = load_config(data={"task": {"name": self.name, **self.options}, "engine": {"name": "benchmark_canned"}},
                             registry=self.scaffold_registry())
        assert config.task.name == self.name

    def test_one_episode_end_to_end(self) -> None:
        """One row runs through the runtime with an engine answering the gold response, and is rewarded."""
        from ..helpers import run_one_episode

        task = self.make_task()
        row = next(r for r in self.some_rows() if task.reference(r) is not None)
        gold = self.gold_response(row, task.reference(row))
        from ...sampling import SamplingParams

        sampling = SamplingParams(max_tokens=len(gold.encode("utf-8")) + 16, temperature=0.0)
        result = run_one_episode(task, row, respond=gold, verifier=self.make_verifier(), sampling=sampling)
        assert result.ok, f"{result.error_component}: {result.error}"
        assert result.samples[0].text == gold
        assert (result.samples[0].reward or 0.0) > 0
        assert result.trajectories and result.trajectories[0].reward > 0
