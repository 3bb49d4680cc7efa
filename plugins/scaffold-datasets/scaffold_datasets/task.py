"""The ``dataset`` task: any Hugging Face ``datasets`` source as prompts and reference answers.

``task: {name: dataset, path: json, data_files: data.jsonl, prompt: question, answer: answer}`` turns a
local JSON-lines, CSV or parquet file, or a hub dataset, into episodes: one row per record, its prompt a
text column (``prompt``) or a chat-messages column (``messages``), its reference answer a column
(``answer``). Records are read as a stream (``datasets``' ``streaming=True``): with ``limit`` and no
``shuffle`` reading stops after ``limit`` usable rows, whatever the file's size. ``datasets`` is imported
only when rows are read.

Every shape of chat data is read: a text prompt column, a column of chat messages (``{role, content}``, content
parts ``[{type: text, text}]``, or ShareGPT's ``{from, value}``), TRL's conversational prompt/completion rows
(``prompt`` and ``completion`` both messages: the completion's assistant text is the answer) and Hugging Face
``messages`` rows that end with the assistant's answer (that message is the reference, never shown to the
model). With neither ``prompt`` nor ``messages`` set, the columns are detected from the first record; what was
detected is said once, on stderr.

Problems with the data are one-line errors that name the file and the column: a column that is not in
the data, an empty split, a file that cannot be read. A record whose prompt cell is empty, or whose answer
cell is empty when the task has an answer column, is skipped and counted (``skipped_rows`` in the run's
metrics), never sent to the model and never scored 0.
"""

from __future__ import annotations

import codecs
import itertools
import json
import random
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar

from annotated_types import Ge

from scaffold_core.errors import DataError
from scaffold_core.task import Task

#: ``path`` values that name a ``datasets`` file builder (the files come from ``data_files``).
BUILDERS = ("json", "csv", "parquet", "text", "arrow")
#: A local file's builder, by suffix, when ``path`` is the file itself.
SUFFIX_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet",
                   ".txt": "text"}
#: Columns tried, in order, when neither ``prompt`` nor ``messages`` is set (chat columns first).
MESSAGE_COLUMNS = ("messages", "conversations", "conversation", "chat")
PROMPT_COLUMNS = ("prompt", "question", "problem", "instruction", "input", "query")
ANSWER_COLUMNS = ("completion", "answer", "solution", "reference", "target", "output", "response")
#: ShareGPT's speaker names, as chat roles.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
                  "system": "system", "tool": "tool", "function": "tool", "observation": "tool"}
#: Builders that take ``encoding`` and ``sep``.
ENCODING_BUILDERS = ("json", "csv", "text")


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
    * ``prompt``: the column holding the prompt text (or chat messages, as TRL's conversational rows hold
      them), or ``messages``: the column holding chat messages (``{role, content}``, content parts, or
      ShareGPT's ``{from, value}``); at most one of them. Neither: detected from the first record (a chat
      column such as ``messages``/``conversations``, else ``prompt``/``question``/...), said on stderr.
    * ``answer``: the column holding the reference answer (a text, or messages: their assistant text; none:
      a ``messages`` row's final assistant message is its answer, else episodes are unscored unless the
      verifier needs no reference). Rows whose answer cell is empty are skipped and counted.
      ``id``: the column naming each row (default: its position).
    * ``encoding`` (``utf-8``): the text encoding of JSON, CSV and text files; ``sep``: CSV's column
      separator (``","``; ``"\t"`` for ``.tsv`` files).
    * ``system_prompt``: a system message put before each text prompt.
    * ``limit``, ``shuffle`` (reads every row, then shuffles with ``seed``), ``seed``.
    * ``cache_dir``: the ``datasets`` cache directory.
    """

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "exact_match"}}

    def __init__(self, path: str, data_files: str | list[str] | dict[str, str | list[str]] | None = None,
                 subset: str | None = None, split: str = "test", prompt: str | None = None,
                 messages: str | None = None, answer: str | None = None, id: str | None = None,
                 system_prompt: str | None = None, limit: Annotated[int, Ge(1)] | None = None, shuffle: bool = False,
                 seed: int = 0, cache_dir: str | None = None, encoding: str | None = None, sep: str | None = None):
        super().__init__()
        if prompt is not None and messages is not None:
            raise ValueError("set one of task.prompt (a column of prompt text) or task.messages (a column of chat "
                             "messages), not both (or neither, to have the columns detected)")
        if not path or not isinstance(path, str):
            raise ValueError("task.path must name a builder (json, csv, parquet), a local file or a hub dataset")
        if not split:
            raise ValueError("split must name a split, e.g. 'test' or 'train'")
        self.builder, self.data_files = _source(path, data_files)
        self.read_options = _read_options(self.builder, path, data_files, encoding, sep)
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
        #: Whether the columns are detected from the first record (neither prompt nor messages set).
        self.auto = prompt is None and messages is None
        #: What was found about the data's shape (said once on stderr): None until rows are read.
        self.detected: str | None = None

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
                                           streaming=True, cache_dir=self.cache_dir, **self.read_options)
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
        if self.auto:
            self._detect_columns(record)
        for option, column in (("prompt", self.prompt), ("messages", self.messages_column),
                               ("answer", self.answer), ("id", self.id)):
            if column is not None and column not in record:
                columns = ", ".join(map(str, record)) or "(none)"
                raise DataError(f"task.{option}: column {column!r} is not in {self.where} (its columns: "
                                f"{columns}); set task.{option} to one of them")
        self._describe(record)

    def _detect_columns(self, record: dict[str, Any]) -> None:
        """``prompt``/``messages`` and ``answer`` from the first record's columns (neither was set)."""
        found = next((c for c in MESSAGE_COLUMNS if _messages(record.get(c))[0] is not None), None)
        if found is None:
            found = next((c for c in PROMPT_COLUMNS if c in record), None)
            if found is None:
                columns = ", ".join(map(str, record)) or "(none)"
                raise DataError(f"task: no prompt column found in {self.where} (its columns: {columns}); set "
                                "task.prompt (a column of prompt text) or task.messages (a column of chat messages)")
            self.prompt = found
        else:
            self.messages_column = found
        if self.answer is None:
            self.answer = next((c for c in ANSWER_COLUMNS if c in record and c != found), None)

    def _describe(self, record: dict[str, Any]) -> None:
        """What the first record's shape is read as (``self.detected``), said on stderr when it was detected or
        is not plain text prompts and answers."""
        column = self.messages_column or self.prompt
        messages, shape = _messages(record.get(column or ""))
        parts: list[str] = []
        notable = self.auto or messages is not None
        if messages is not None:
            kind = "TRL conversational prompts" if self.prompt is not None else "chat messages"
            parts.append(f"column {column!r} holds {kind} ({shape})")
            if self.answer is None and messages[-1]["role"] == "assistant":
                parts.append("each row's last assistant message is its answer, never shown to the model")
        else:
            parts.append(f"column {column!r} holds prompt text")
        if self.answer is not None:
            answer, answer_shape = _messages(record.get(self.answer))
            held = f"chat messages ({answer_shape}): the assistant's text" if answer is not None else "the answer"
            parts.append(f"column {self.answer!r} holds {held}")
            notable = notable or answer is not None
        elif messages is None or messages[-1]["role"] != "assistant":
            parts.append("no answer column: episodes are unscored unless the verifier needs no reference")
        self.detected = "; ".join(parts)
        if notable:
            print(f"scaffold: task dataset ({self.where}): {'detected ' if self.auto else ''}{self.detected}",
                  file=sys.stderr)

    def make_row(self, record: dict[str, Any], index: int, seen: set[str]) -> dict[str, Any] | None:
        """A task row from one record, or None with the reason counted in ``skipped``."""
        row: dict[str, Any] = {}
        answer: Any = None
        column = self.messages_column or self.prompt or ""
        value = record.get(column)
        messages, _shape = _messages(value)
        if messages is None and self.messages_column is None and isinstance(value, (str, int, float)) \
                and not isinstance(value, bool):
            text = str(value)
            if not text.strip():
                self.skipped["empty prompt"] += 1
                return None
            row["prompt"] = text
        elif messages is None:
            self.skipped["empty prompt" if value is None or value == [] or value == "" else
                         "messages not a list of chat messages" if self.messages_column else "prompt not text"] += 1
            return None
        else:
            if messages[-1]["role"] == "assistant" and self.answer is None:
                answer = messages[-1]["content"]  # the conversation's answer: the reference, never the prompt
                messages = messages[:-1]
            if not messages or messages[-1]["role"] == "assistant":
                self.skipped["no user turn to answer"] += 1
                return None
            row["messages"] = messages
        if self.answer is not None:
            answer = _answer(record.get(self.answer))
        if (self.answer is not None or "prompt" not in row and answer is not None) and _empty(answer):
            self.skipped["empty answer"] += 1  # never an episode scored 0 for want of a reference
            return None
        if answer is not None:
            row["answer"] = answer
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


def _messages(value: Any) -> tuple[list[dict[str, str]] | None, str]:
    """Chat messages as ``{role, content}`` text dicts and the shape they came in (``{role, content}``, content
    parts, ShareGPT's ``{from, value}``), or (None, "") when ``value`` is not a non-empty list of messages."""
    if not isinstance(value, list) or not value:
        return None, ""
    out: list[dict[str, str]] = []
    shapes: set[str] = set()
    for message in value:
        if not isinstance(message, dict):
            return None, ""
        if isinstance(message.get("role"), str):
            role, content, shape = message["role"], message.get("content"), "{role, content}"
        elif isinstance(message.get("from"), str) and message["from"].lower() in SHAREGPT_ROLES:
            role, content = SHAREGPT_ROLES[message["from"].lower()], message.get("value")
            shape = "ShareGPT {from, value}"
        else:
            return None, ""
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                return None, ""
            content, shape = "".join(p["text"] for p in content), shape + " with content parts"
        if content is None:
            content = ""
        if not isinstance(content, str):
            return None, ""
        shapes.add(shape)
        out.append({"role": role, "content": content})
    return out, " and ".join(sorted(shapes))


def _answer(value: Any) -> Any:
    """A reference from an answer cell: messages become their assistant text (TRL's conversational completion)."""
    messages, _ = _messages(value)
    if messages is not None:
        said = [m["content"] for m in messages if m["role"] == "assistant"] or [m["content"] for m in messages]
        return "\n".join(said)
    return json_value(value)


def _empty(answer: Any) -> bool:
    return answer is None or (isinstance(answer, str) and not answer.strip()) or answer == []


def _read_options(builder: str | None, path: str, data_files: Any, encoding: str | None,
                  sep: str | None) -> dict[str, Any]:
    """The reader's keyword arguments for ``encoding`` and ``sep`` (``\t`` for ``.tsv`` files), checked."""
    options: dict[str, Any] = {}
    if encoding is not None:
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise ValueError(f"task.encoding: {encoding!r} is not a text encoding Python knows (utf-8, latin-1, "
                             "cp1252, utf-16, ...)") from None
        if builder not in ENCODING_BUILDERS:
            raise ValueError(f"task.encoding applies to JSON, CSV and text files, not {builder or path!r}")
        options["encoding"] = encoding
    tsv = builder == "csv" and str(path if data_files is None else _shown(data_files)).lower().endswith(".tsv")
    if sep is not None:
        if builder != "csv":
            raise ValueError(f"task.sep is CSV's column separator; {builder or path!r} is not CSV")
        if not isinstance(sep, str) or not sep:
            raise ValueError(f"task.sep must be a non-empty string (\",\", \"\\t\", \";\"), got {sep!r}")
        options["sep"] = sep
    elif tsv:
        options["sep"] = "\t"
    return options


def json_value(value: Any) -> Any:
    """``value`` if it is JSON (references are written to the run's store as JSON), else its text."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value
