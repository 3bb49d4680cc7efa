"""What a report page is made of: everything read from one run directory, before it becomes HTML."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .episodes import Stats


@dataclass
class Report:
    """Everything a page is made of, read from one run directory."""

    directory: Path
    kind: str
    config_text: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None
    train_summary: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    stats: Stats | None = None
    episodes: list[dict[str, Any]] = field(default_factory=list)
    vocab: dict[str, str] = field(default_factory=dict)
    tokens_from: str = ""
    versions: dict[str, Any] = field(default_factory=dict)
    versions_recorded: bool = False
    #: ``provenance.json``: the model, its weights' fingerprint, tokenizer, engine, seed (empty for old runs).
    provenance: dict[str, Any] = field(default_factory=dict)
    trace: str | None = None  # the trace file written beside the page (its name), if any
