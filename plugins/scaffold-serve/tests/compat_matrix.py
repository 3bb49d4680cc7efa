"""The compatibility matrix: what each real client did against the server, measured by the tests that ran it.

Each matrix test runs a client in its default mode against a live server and calls
:func:`record` with the cell it measured from the session (:func:`measure`). The cells
live in ``compat_matrix.json`` beside this file, and docs/serve.md shows them as a table
(:func:`render`, between the ``compat-matrix`` markers). Nothing is typed by hand:

* normally a test asserts that its measured cell equals the committed one, and
  ``test_the_docs_show_the_matrix`` that the doc's table is the rendering of the file:
  a client that changed behaviour, or a stale doc, fails;
* ``SCAFFOLD_WRITE_MATRIX=1 pytest plugins/scaffold-serve/tests/test_matrix.py
  plugins/scaffold-serve/tests/test_smollm2.py -n 0`` rewrites the cells it measured and the doc's table.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MATRIX = HERE / "compat_matrix.json"
DOC = HERE.parents[2] / "docs" / "serve.md"
START, END = "<!-- compat-matrix:start -->", "<!-- compat-matrix:end -->"
WRITE = os.environ.get("SCAFFOLD_WRITE_MATRIX") == "1"
COLUMNS = ("client", "mode", "engine", "stream", "runs", "calls", "conversations", "drift", "model turns kept",
           "logprobs")
#: The distribution whose version each client's row names (a client from npm gives its own).
DISTRIBUTIONS = {"openai": "openai", "openai-agents": "openai-agents", "langgraph": "langgraph",
                 "smolagents": "smolagents", "pydantic-ai": "pydantic-ai-slim", "litellm": "litellm",
                 "anthropic": "anthropic"}


def load() -> dict[str, dict[str, Any]]:
    return json.loads(MATRIX.read_text()) if MATRIX.exists() else {}


def key(client: str, mode: str, engine: str, stream: bool) -> str:
    return f"{client} | {mode} | {engine} | {'on' if stream else 'off'}"


def found(ids: list[int], part: list[int], mask: list[int] | None = None) -> int:
    """Where ``part`` starts in ``ids`` (-1 when it is not there); with ``mask``, only where the mask is 1 throughout
    (a model turn, not the same ids quoted in a prompt)."""
    n = len(part)
    for i in range(len(ids) - n + 1):
        if ids[i:i + n] == part and (mask is None or all(mask[i:i + n])):
            return i
    return -1


def measure(session: Any, logprobs: str = "engine's") -> dict[str, Any]:
    """The cell a session shows: its calls, conversations and drift, and whether every model turn (tool calls
    included) is in its conversation token for token (mask 1, the engine's logprobs, none a placeholder: a token the
    grammar forced has logprob 0 under the constraint, but not every token does)."""
    kept = any(lp < 0 for call in session.calls for choice in call["choices"] for lp in choice["logprobs"])
    for call in session.calls:
        for choice in call["choices"]:
            record = session.trajectories[choice["trajectory"]].to_dict()
            at = found(record["input_ids"], choice["output_ids"], record["loss_mask"])
            span = range(at, at + len(choice["output_ids"]))
            kept = kept and at >= 0 and all(record["loss_mask"][i] == 1 for i in span) \
                and [record["logprobs"][i] for i in span] == choice["logprobs"] \
                and all(lp <= 0 for lp in choice["logprobs"])
    return {"runs": "yes", "calls": session.counts["calls"], "conversations": len(session.trajectories),
            "drift": session.drift_count, "model turns kept": "yes" if kept else "NO", "logprobs": logprobs}


def record(client: str, mode: str, engine: str, stream: bool, cell: dict[str, Any], version: str | None = None) -> None:
    """Check ``cell`` against the committed matrix (or, with SCAFFOLD_WRITE_MATRIX=1, write it there). ``version``:
    the client's, when it is no Python distribution (a CLI from npm)."""
    name = key(client, mode, engine, stream)
    version = version or metadata.version(DISTRIBUTIONS[client])
    entry = {**cell, "version": version}
    matrix = load()
    if WRITE:
        matrix[name] = entry
        MATRIX.write_text(json.dumps(dict(sorted(matrix.items())), indent=1) + "\n")
        return
    committed = matrix.get(name)
    assert committed is not None, f"{name} is not in {MATRIX.name}; rerun with SCAFFOLD_WRITE_MATRIX=1"
    measured = {k: v for k, v in entry.items() if k != "version"}
    assert {k: v for k, v in committed.items() if k != "version"} == measured, (
        f"{name}: measured {measured}, the matrix says {committed}; if the change is right, rerun with "
        "SCAFFOLD_WRITE_MATRIX=1 (docs/serve.md follows)")


def render(matrix: dict[str, dict[str, Any]]) -> str:
    """The markdown table of the matrix (the doc shows exactly this)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, cell in matrix.items():
        client, mode, engine, stream = name.split(" | ")
        label = f"{client} {cell['version']}"
        values = [label, mode, engine, stream, *(str(cell[c]) for c in COLUMNS[4:])]
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def doc_section() -> str:
    text = DOC.read_text()
    if START not in text or END not in text:
        return ""
    return text[text.index(START) + len(START):text.index(END)].strip()


def write_doc() -> None:
    text = DOC.read_text()
    table = render(load())
    DOC.write_text(text[:text.index(START) + len(START)] + "\n" + table + "\n" + text[text.index(END):])
