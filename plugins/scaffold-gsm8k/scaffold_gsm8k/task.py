"""The ``gsm8k`` task: rows, prompts, gold answers and the defaults a GSM8K rollout needs."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge

from scaffold_core.plugins import Help
from scaffold_core.task import Task

from . import data
from .answers import AnswerError, canonical_number, gold_answer
from .prompts import DEFAULT_INSTRUCTION, DEFAULT_SYSTEM_PROMPT, build_messages, check_instruction


class GSM8KTask(Task):
    """GSM8K math word problems from the hub (openai/gsm8k), local jsonl/parquet files, or a bundled sample.

    Options (the ``task:`` section of a config):

    * ``source``: ``hub`` (default: ``openai/gsm8k``, config ``main``) or
      ``sample`` (the bundled offline sample, problems written for scaffold).
    * ``data_files``: local ``.jsonl``/``.parquet`` file(s) with ``question``
      and ``answer`` fields, instead of the hub: a path, a list, or a mapping
      ``{split: path(s)}``.
    * ``split`` (``test``), ``limit``, ``shuffle``, ``seed``.
    * ``system_prompt`` (null for none), ``instruction`` (must contain ``{question}``).
    * ``few_shot``: worked examples from the source's ``train`` split shown
      as earlier chat turns; ``few_shot_file`` takes them from another file.
    * ``cache_dir``: the ``datasets`` cache directory for hub and file sources.

    Rows without a question, or whose answer has no number after its last
    ``####``, are skipped and counted in ``skipped`` (reported in the run's
    metrics as ``skipped_rows``). With ``limit`` and no ``shuffle``, reading
    stops at the ``limit``-th usable row: later rows are neither read nor
    counted (a shuffled run reads every row, then takes ``limit`` of them).
    """

    default_config: ClassVar[dict[str, Any]] = {
        "sampling": {"max_tokens": 512, "temperature": 1.0},
        "verifier": {"name": "gsm8k"},
    }

    def __init__(
        self,
        source: Literal["hub", "sample"] = "hub",
        split: str = "test",
        data_files: str | list[str] | dict[str, str | list[str]] | None = None,
        limit: Annotated[int, Ge(1)] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        instruction: str = DEFAULT_INSTRUCTION,
        few_shot: Annotated[int, Ge(0), Help("worked examples put before each question")] = 0,
        few_shot_file: str | None = None,
        cache_dir: str | None = None,
    ):
        super().__init__()
        if not split:
            raise ValueError("split must name a split, e.g. 'test' or 'train'")
        if data_files is not None and source == "sample":
            raise ValueError("set either source: sample or data_files, not both")
        if source == "sample":
            data.sample_path(split)  # raises for a split the sample lacks
        if data_files is not None:
            paths = data.files_for_split(data_files, split)
            data.builder_for(paths)
            data.check_local_files(paths)
        if few_shot_file is not None:
            data.builder_for([few_shot_file])
            data.check_local_files([few_shot_file])
        elif few_shot and data_files is not None and not (isinstance(data_files, dict) and "train" in data_files):
            raise ValueError(
                "few_shot needs worked examples: give data_files as a mapping with a 'train' split "
                "(data_files: {train: train.jsonl, test: test.jsonl}) or set few_shot_file")
        self.source = source
        self.split = split
        self.data_files = data_files
        self.limit = limit
        self.shuffle = shuffle
        self.seed = seed
        self.system_prompt = system_prompt
        self.instruction = check_instruction(instruction)
        self.few_shot = few_shot
        self.few_shot_file = few_shot_file
        self.cache_dir = cache_dir
        self._examples: list[dict[str, Any]] | None = None

    # -- rows ---------------------------------------------------------------
    def _records(self, split: str) -> Iterable[Any]:
        """The source's records of ``split``, converted to Python as they are taken."""
        if self.data_files is not None:
            return data.iter_files(self.data_files, split, cache_dir=self.cache_dir)
        if self.source == "sample":
            return data.read_sample(split)
        return data.iter_hub(split, cache_dir=self.cache_dir)

    @staticmethod
    def make_row(record: Any, index: int, split: str, skipped: Counter[str], seen: set[str]) -> dict[str, Any] | None:
        """A task row from a source record, or None (with the reason counted in ``skipped``)."""
        if not isinstance(record, dict):
            skipped["not a record"] += 1
            return None
        question = record.get("question")
        if not isinstance(question, str) or not question.strip():
            skipped["missing question"] += 1
            return None
        answer = record.get("answer")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            skipped["missing answer"] += 1
            return None
        gold = gold_answer(answer)
        try:
            canonical_number(gold)
        except AnswerError:
            skipped["answer without a number"] += 1
            return None
        given = record.get("id")
        if isinstance(given, (str, int)) and not isinstance(given, bool) and str(given).strip():
            row_id = str(given).strip()
        else:
            row_id = f"{split}-{index}"
        if row_id in seen:
            skipped["duplicate id"] += 1
            return None
        seen.add(row_id)
        return {"id": row_id, "question": question.strip(), "answer": answer, "gold": gold}

    def _rows(self, split: str, skipped: Counter[str]) -> Iterator[dict[str, Any]]:
        """The usable rows of ``split``, made as the records are read."""
        seen: set[str] = set()
        for index, record in enumerate(self._records(split)):
            row = self.make_row(record, index, split, skipped, seen)
            if row is not None:
                yield row

    def load(self) -> list[dict[str, Any]]:
        """The usable rows of ``split``, shuffled (if asked) with ``seed``, then cut to ``limit``
        (without shuffling, reading stops once ``limit`` rows are found)."""
        self.skipped: Counter[str] = Counter()
        usable: Iterable[dict[str, Any]] = self._rows(self.split, self.skipped)
        if self.shuffle:
            usable = list(usable)
            random.Random(self.seed).shuffle(usable)
        rows = list(itertools.islice(usable, self.limit))
        if self.few_shot and self._examples is None:
            self._examples = self._load_examples()
        return rows

    # -- few-shot examples --------------------------------------------------
    def _load_examples(self) -> list[dict[str, Any]]:
        """``few_shot + 1`` usable worked examples (one spare replaces the asked question itself)."""
        ignored: Counter[str] = Counter()
        seen: set[str] = set()
        records: Iterable[Any]
        if self.few_shot_file is not None:
            records = data.iter_files(self.few_shot_file, "train", cache_dir=self.cache_dir)
            where = self.few_shot_file
        else:
            records = self._records("train")
            where = "the train split of the task's source"
        pool = []
        for index, record in enumerate(records):
            row = self.make_row(record, index, "train", ignored, seen)
            if row is not None:
                pool.append(row)
        if len(pool) < self.few_shot:
            raise data.DataSourceError(
                f"task.few_shot: {self.few_shot} examples asked for, but {where} has only {len(pool)} usable rows")
        return random.Random(self.seed).sample(pool, min(len(pool), self.few_shot + 1))

    def examples_for(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The few-shot examples shown before ``row`` (never ``row``'s own question)."""
        if not self.few_shot:
            return []
        if self._examples is None:
            self._examples = self._load_examples()
        question = row["question"].strip()
        return [e for e in self._examples if e["question"].strip() != question][:self.few_shot]

    # -- the Task contract ----------------------------------------------------
    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return build_messages(row["question"], system_prompt=self.system_prompt, instruction=self.instruction,
                              examples=self.examples_for(row))

    def reference(self, row: dict[str, Any]) -> str | None:
        return row["gold"]
