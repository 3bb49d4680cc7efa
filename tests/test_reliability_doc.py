"""docs/reliability.md names the test behind every fault it lists: those tests must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_named_in_reliability_md_exists():
    doc = (ROOT / "docs" / "reliability.md").read_text()
    current = None
    missing = []
    for match in re.finditer(r"`([\w./-]+\.py)(?:::(\w+))?`|`::(\w+)`", doc):
        path, name, continued = match.groups()
        if path:
            current = path
            if not (ROOT / path).exists():
                missing.append(path)
                continue
        name = name or continued
        if name and current and current.endswith(".py") and f"def {name}(" not in (ROOT / current).read_text():
            missing.append(f"{current}::{name}")
    assert not missing, missing
