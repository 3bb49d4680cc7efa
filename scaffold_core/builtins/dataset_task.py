"""The built-in ``dataset`` task: any Hugging Face ``datasets`` source as prompts and reference answers.

``task: {name: dataset, path: json, data_files: data.jsonl, prompt: question, answer: answer}`` turns a
local JSON-lines, CSV or parquet file, or a hub dataset, into episodes: one row per record, its prompt a
text column (``prompt``) or a chat-messages column (``messages``), its reference answer a column
(``answer``). Records are read as a stream (``datasets``' ``streaming=True``): with ``limit`` and no
``shuffle`` reading stops after ``limit`` usable rows, whatever the file's size. ``datasets`` is imported
only when rows are read.

Problems with the data are one-line errors that name the file and the column: a column that is not in
the data, an empty split, a file that cannot be read. A record whose prompt cell is empty is skipped and
counted (``skipped_rows`` in the run's metrics), never sent to the model.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from ..errors import DataError
from ..task import Task

#: ``path`` values that name a ``datasets`` file builder (the files come from ``data_files``).
BUILDERS = ("json", "csv", "parquet", "text", "arrow")
#: A local file's builder, by suffix, when ``path`` is the file itself.
SUFFIX_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


def _shown(data_files: Any) -> str:
    if isinstance(data_files, dict):
        return ", ".join(f"{split}: {_shown(files)}" for split, files in data_files.items())
    if isinstance(data_files, (list, tuple)):
        return ", ".join(map(str, data_files))
    return str(data_files)


class DatasetTask(Task):
    """Prompts and answers from any ``datasets`` source (see the module docstring).

    Options:

    * ``path``: a builder (``json``, ``csv``, ``parquet``, ``text``, ``arrow``) with ``data_files``; a
      local file (its suffix names the builder); or a hub dataset id (``openai/gsm8k``).
    * ``data_files``: the files of a builder: a path, a list, or ``{split: path(s)}``.
    * ``subset``: the hub dataset's configuration (``main``); ``split`` (``test``).
    * ``prompt``: the column holding the prompt text, or ``messages``: the column holding chat
      messages (a list of ``{role, content}``); exactly one of them.
    * ``answer``: the column holding the reference answer (none: episodes are unscored unless the
      verifier needs no reference). ``id``: the column naming each row (default: its position).
    * ``system_prompt``: a system message put before each text prompt.
    * ``limit``, ``shuffle`` (reads every row, then shuffles with ``seed``), ``seed``.
    * ``cache_dir``: the ``datasets`` cache directory.
    """

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "exact_match"}}

    def __init__(self, path: str, data_files: str | list[str] | dict[str, str | list[str]] | None = None,
                 subset: str | None = None, split: str = "test", prompt: str | None = None,
                 messages: str | None = None, answer: str | None = None, id: str | None = None,
                 system_prompt: str | None = None, limit: int | None = None, shuffle: bool = False,
                 seed: int = 0, cache_dir: str | None = None):
        super().__init__()
        if (prompt is None) == (messages is None):
            raise ValueError("set exactly one of task.prompt (a column of prompt text) or task.messages "
                             "(a column of chat messages)")
        if not path or not isinstance(path, str):
            raise ValueError("task.path must name a builder (json, csv, parquet), a local file or a hub dataset")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 (or null for every row), got {limit}")
        if not split:
            raise ValueError("split must name a split, e.g. 'test' or 'train'")
        self.builder, self.data_files = _source(path, data_files)
        if isinstance(self.data_files, dict) and split not in self.data_files:
            raise ValueError(f"task.split {split!r} is not in task.data_files (its splits: "
                             f"{', '.join(map(str, self.data_files))})")
        self.path = path
        self.subset = subset
        self.split = split
        self.prompt = prompt
        self.messages_column = messages
        self.answer = answer
        self.id = id
        self.system_prompt = system_prompt
        self.limit = limit
        self.shuffle = shuffle
        self.seed = seed
        self.cache_dir = cache_dir
        #: Records taken from the stream by the last ``load()`` (usable or not).
        self.rows_read = 0

    # -- where the records come from -------------------------------------------------------
    @property
    def where(self) -> str:
        """The source as a user wrote it, for error messages."""
        return _shown(self.data_files) if self.data_files is not None else self.path

    def _stream(self) -> Iterator[Any]:
        """The split's records, streamed; errors name the source."""
        import datasets

        name = self.builder or self.path
        data_files = self.data_files
        if data_files is not None and not isinstance(data_files, dict):
            data_files = {self.split: data_files}  # files given without splits are the configured split
        try:
            stream = datasets.load_dataset(name, self.subset, data_files=data_files, split=self.split,
                                           streaming=True, cache_dir=self.cache_dir)
        except Exception as exc:
            raise DataError(self._unreadable(exc)) from None
        iterator = iter(stream)
        while True:
            try:
                record = next(iterator)
            except StopIteration:
                return
            except Exception as exc:
                raise DataError(self._unreadable(exc)) from None
            self.rows_read += 1
            yield record

    def _unreadable(self, exc: Exception) -> str:
        if isinstance(exc, StopIteration):  # `datasets` found nothing to infer the columns from
            return f"task: {self.where} has no rows in split {self.split!r}"
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        if len(detail) > 300:
            detail = detail[:297] + "..."
        if self.builder is None:
            return (f"task.path: could not load the dataset {self.path!r} (subset {self.subset!r}, split "
                    f"{self.split!r}): {detail}. Offline? Download it, or point the task at local files "
                    "(path: json, data_files: data.jsonl)")
        return f"task.data_files: could not read {self.where} as {self.builder} (split {self.split!r}): {detail}"

    # -- rows -----------------------------------------------------------------------------
    def _check_columns(self, record: Any) -> None:
        if not isinstance(record, dict):
            raise DataError(f"task: {self.where} gives {type(record).__name__} records, not rows with columns")
        for option, column in (("prompt", self.prompt), ("messages", self.messages_column),
                               ("answer", self.answer), ("id", self.id)):
            if column is not None and column not in record:
                columns = ", ".join(map(str, record)) or "(none)"
                raise DataError(f"task.{option}: column {column!r} is not in {self.where} (its columns: "
                                f"{columns}); set task.{option} to one of them")

    def make_row(self, record: dict[str, Any], index: int, seen: set[str]) -> dict[str, Any] | None:
        """A task row from one record, or None with the reason counted in ``skipped``."""
        row: dict[str, Any] = {}
        if self.prompt is not None:
            text = record.get(self.prompt)
            if isinstance(text, (int, float)) and not isinstance(text, bool):
                text = str(text)
            if text is None or (isinstance(text, str) and not text.strip()):
                self.skipped["empty prompt"] += 1
                return None
            if not isinstance(text, str):
                self.skipped["prompt not text"] += 1
                return None
            row["prompt"] = text
        else:
            messages = _messages(record.get(self.messages_column or ""))
            if messages is None:
                self.skipped["messages not a list of {role, content}"] += 1
                return None
            row["messages"] = messages
        if self.answer is not None:
            row["answer"] = json_value(record.get(self.answer))
        given = record.get(self.id) if self.id is not None else None
        row_id = str(given).strip() if given is not None and str(given).strip() else f"{self.split}-{index}"
        if row_id in seen:
            self.skipped["duplicate id"] += 1
            return None
        seen.add(row_id)
        return {"id": row_id, **row}

    def _rows(self) -> Iterator[dict[str, Any]]:
        seen: set[str] = set()
        for index, record in enumerate(self._stream()):
            if index == 0:
                self._check_columns(record)
            row = self.make_row(record, index, seen)
            if row is not None:
                yield row

    def load(self) -> list[dict[str, Any]]:
        """The usable rows, shuffled (reading them all) with ``seed`` if asked, cut to ``limit``."""
        self.skipped = Counter()
        self.rows_read = 0
        rows: Any = self._rows()
        if self.shuffle:
            rows = list(rows)
            random.Random(self.seed).shuffle(rows)
        taken = list(itertools.islice(rows, self.limit))
        if not taken:
            if self.rows_read == 0:
                raise DataError(f"task: {self.where} has no rows in split {self.split!r}")
            reasons = ", ".join(f"{n} {why}" for why, n in self.skipped.items())
            raise DataError(f"task: {self.where} has no usable rows in split {self.split!r} ({reasons})")
        return taken

    # -- the Task contract ------------------------------------------------------------------
    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        if "messages" in row:
            return [dict(m) for m in row["messages"]]
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*out, {"role": "user", "content": row["prompt"]}]

    def reference(self, row: dict[str, Any]) -> Any:
        return row.get("answer")


def _source(path: str, data_files: Any) -> tuple[str | None, Any]:
    """(the builder, the data files) for ``path``; (None, data_files) for a hub dataset."""
    if path in BUILDERS:
        if data_files is None:
            raise ValueError(f"task.path {path!r} reads files: set task.data_files to the file(s)")
        _check_files(data_files)
        return path, data_files
    local = Path(path).expanduser()
    suffix = local.suffix.lower()
    if suffix in SUFFIX_BUILDERS or local.exists():
        if data_files is not None:
            raise ValueError(f"task.path {path!r} is a file: leave task.data_files unset, or set path to a builder "
                             f"({', '.join(BUILDERS)})")
        if suffix not in SUFFIX_BUILDERS:
            raise ValueError(f"task.path {path!r}: the builder is not known from the suffix; set path to one of "
                             f"{', '.join(BUILDERS)} and data_files: {path}")
        _check_files(str(local))
        return SUFFIX_BUILDERS[suffix], str(local)
    return None, data_files


def _check_files(data_files: Any) -> None:
    """Fail early (before any model loads) on local paths that do not exist; globs and URLs pass."""
    if isinstance(data_files, dict):
        for files in data_files.values():
            _check_files(files)
        return
    for path in data_files if isinstance(data_files, (list, tuple)) else [data_files]:
        text = str(path)
        if any(ch in text for ch in "*?[") or "://" in text:
            continue
        if not Path(text).expanduser().is_file():
            raise ValueError(f"task.data_files: {text} does not exist (paths are relative to the current directory)")


def _messages(value: Any) -> list[dict[str, str]] | None:
    if not isinstance(value, list) or not value:
        return None
    out = []
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            return None
        out.append({"role": message["role"], "content": message["content"]})
    return out


def json_value(value: Any) -> Any:
    """``value`` if it is JSON (references are written to the run's store as JSON), else its text."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value
