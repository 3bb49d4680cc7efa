"""A plugin for the training tests: a verifier whose reward the row's reference chooses, and a way to hold a
training process at a chosen verification (to kill it there).

Enable it in a subprocess with ``SCAFFOLD_EXTRA_PLUGINS=training_plugin`` and this folder on ``PYTHONPATH``.

Verifier ``by_reference``: reference ``zero`` -> 0.0 and ``one`` -> 1.0 for every response (every group of
such rows has zero variance); ``length`` -> the response's length in characters / 100 (samples of one prompt
almost never tie). With ``SCAFFOLD_TEST_HOLD_AT=N`` and ``SCAFFOLD_TEST_HOLD_FILE=path``, the N-th verification
of the process writes ``path`` and then waits (60 s at most) for the process to be killed.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

from scaffold_core import hookimpl
from scaffold_core.verifier import Verdict, Verifier

_calls = itertools.count(1)
_lock = threading.Lock()


class ByReference(Verifier):
    def verify(self, response: str, reference: str | None) -> Verdict:
        with _lock:
            call = next(_calls)
        hold = os.environ.get("SCAFFOLD_TEST_HOLD_AT")
        if hold and call == int(hold):
            Path(os.environ["SCAFFOLD_TEST_HOLD_FILE"]).write_text(str(os.getpid()))
            time.sleep(60)
        if reference == "length":
            return Verdict(len(response) / 100, None, None, "length")
        return Verdict(1.0 if reference == "one" else 0.0, None, None, str(reference))


@hookimpl
def register_verifiers(registry):
    registry.add("by_reference", ByReference)
