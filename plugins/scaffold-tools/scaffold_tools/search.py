"""The ``search`` tool: BM25 retrieval over a local JSONL document collection (``bm25s``).

Each line of the collection is a JSON object with an id, a title and a text (the field names are
options). The index is built once per tool instance, in ``start()`` or on the first call, in a
worker thread; queries run in a worker thread too, so a large collection never stalls the event
loop. Without ``path``, the tool searches a small bundled collection (``data/encyclopedia.jsonl``:
units, calendar, money, geometry and general-knowledge facts), so search-agent examples run offline.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any

from annotated_types import Ge, Gt

from scaffold_core.errors import ConfigError
from scaffold_core.plugins import Help
from scaffold_core.tool import Tool, ToolCallError, ToolContext, ToolResult

SAMPLE_COLLECTION = "encyclopedia.jsonl"


def sample_collection_path() -> str:
    """The path of the bundled sample collection."""
    return str(resources.files("scaffold_tools").joinpath("data").joinpath(SAMPLE_COLLECTION))


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


def load_collection(path: str, *, id_field: str = "id", title_field: str = "title",
                    text_field: str = "text") -> list[Document]:
    """Read a JSONL collection; raise :class:`ConfigError` naming the file, line and field at fault."""
    documents: list[Document] = []
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"search: cannot read the collection {path!r}: {exc.strerror}; set `path` to a JSONL "
                          "file with one document per line") from None
    with handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"search: {path}:{lineno}: not valid JSON ({exc.msg}); each line must be "
                                  "one JSON object") from None
            if not isinstance(row, dict):
                raise ConfigError(f"search: {path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            text = row.get(text_field)
            if not isinstance(text, str) or not text.strip():
                fields = ", ".join(sorted(map(str, row))) or "none"
                raise ConfigError(f"search: {path}:{lineno}: no text in field {text_field!r} (fields: {fields}); "
                                  "set `text_field` to the field that holds the document's text")
            doc_id = row.get(id_field, lineno)
            title = row.get(title_field) or ""
            documents.append(Document(str(doc_id), str(title), text.strip()))
    if not documents:
        raise ConfigError(f"search: the collection {path!r} has no documents")
    return documents


class _Index:
    """A BM25 index over documents (title and text), built once."""

    def __init__(self, documents: list[Document], stopwords: str | None):
        import bm25s  # lazily: only a run that searches pays for the import

        self.bm25s = bm25s
        self.documents = documents
        self.stopwords = stopwords
        corpus = [f"{doc.title}\n{doc.text}" if doc.title else doc.text for doc in documents]
        tokens = bm25s.tokenize(corpus, stopwords=stopwords, show_progress=False)
        self.retriever = bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[Document, float]]:
        words = self.bm25s.tokenize([query], stopwords=self.stopwords, return_ids=False, show_progress=False)
        if not words or not words[0]:
            return []
        k = min(k, len(self.documents))
        ids, scores = self.retriever.retrieve(words, k=k, show_progress=False, n_threads=1)
        return [(self.documents[int(i)], float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


class SearchTool(Tool):
    """Searches a local document collection (BM25) and returns the best passages with ids and titles."""

    name = "search"
    description = (
        "Search a collection of reference documents by keywords and return the most relevant passages, "
        "each with its id and title. Use it to look up facts (definitions, unit conversions, places, "
        "dates) you are not sure of."
    )
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1,
                      "description": "Keywords or a short question, e.g. \"how many feet in a mile\"."},
        },
        "required": ["query"],
        "additionalProperties": False,
    }

    def __init__(self, path: Annotated[str | None, Help("a JSONL collection (default: the bundled sample)")] = None,
                 top_k: Annotated[int, Ge(1), Help("passages returned")] = 3, id_field: str = "id",
                 title_field: str = "title", text_field: str = "text",
                 max_chars: Annotated[int, Ge(20), Help("a passage is cut to this")] = 600,
                 stopwords: str | None = "en",
                 max_query_chars: Annotated[int, Ge(1), Help("a longer query is refused")] = 500,
                 timeout: Annotated[float, Gt(0), Help("seconds one call may take")] = 10.0):
        self.path = os.path.expanduser(path) if path else sample_collection_path()
        if not os.path.isfile(self.path):
            raise ConfigError(f"search: the collection {self.path!r} does not exist; set `path` to a JSONL file "
                              "(one JSON object per line, with id, title and text fields), or leave it unset to "
                              "search the bundled sample collection")
        self.top_k = top_k
        self.fields = {"id_field": id_field, "title_field": title_field, "text_field": text_field}
        self.max_chars = max_chars
        self.stopwords = stopwords or None
        self.max_query_chars = max_query_chars
        self.timeout = timeout
        self._index: _Index | None = None
        self._lock = threading.Lock()

    def _build(self) -> _Index:
        with self._lock:
            if self._index is None:
                self._index = _Index(load_collection(self.path, **self.fields), self.stopwords)
            return self._index

    async def start(self) -> None:
        """Load the collection and build the index (raises ConfigError when the collection is unusable)."""
        await asyncio.to_thread(self._build)

    async def close(self) -> None:
        self._index = None

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        query = arguments["query"].strip()
        if not query:
            raise ToolCallError("search: the query is empty; send keywords in `query`", kind="bad_arguments")
        if len(query) > self.max_query_chars:
            raise ToolCallError(f"search: the query is {len(query)} characters long; the limit is "
                                f"{self.max_query_chars}", kind="bad_arguments")
        index = self._index if self._index is not None else await asyncio.to_thread(self._build)
        hits = await asyncio.to_thread(index.search, query, self.top_k)
        metadata = {"ids": [doc.id for doc, _ in hits], "scores": [round(score, 4) for _, score in hits]}
        if not hits:
            return ToolResult(content=f"No documents match {query!r}. Try other keywords.", metadata=metadata)
        return ToolResult(content=self.format(hits), metadata=metadata)

    def format(self, hits: list[tuple[Document, float]]) -> str:
        """``[1] id | title`` then the passage, for each hit, best first."""
        blocks = []
        for rank, (doc, _score) in enumerate(hits, start=1):
            text = doc.text if len(doc.text) <= self.max_chars else doc.text[: self.max_chars - 3].rstrip() + "..."
            header = f"[{rank}] {doc.id}" + (f" | {doc.title}" if doc.title else "")
            blocks.append(f"{header}\n{text}")
        return "\n\n".join(blocks)
