"""scaffold-verifiers tests: the environments written for them (tests/envs) are importable, as installed
verifiers environments are."""

from __future__ import annotations

import sys
from pathlib import Path

ENVS = Path(__file__).resolve().parent / "envs"
if str(ENVS) not in sys.path:
    sys.path.insert(0, str(ENVS))
