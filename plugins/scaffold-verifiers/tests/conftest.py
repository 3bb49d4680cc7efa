"""scaffold-verifiers tests: the environments written for them (tests/envs) are importable, as installed
verifiers environments are: here, and in the processes the library starts (tool servers run as
``python -m <module>``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENVS = Path(__file__).resolve().parent / "envs"
if str(ENVS) not in sys.path:
    sys.path.insert(0, str(ENVS))
if str(ENVS) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ENVS), os.environ.get("PYTHONPATH")) if p)
