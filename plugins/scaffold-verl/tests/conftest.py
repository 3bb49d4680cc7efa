"""scaffold-verl tests: the fake verl (fake_verl.py) and shared helpers are plain importable modules."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
