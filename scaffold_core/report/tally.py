"""What the report counts of a run, counted while the run appends its episodes.

At the end of ``scaffold run`` the report needs every episode's head (for its
counts and charts) and the place of each line in the ledger (to read back the
few episodes it shows). Reading them from the ledger means parsing every line
again; a :class:`RunTally` is given each record as the run appends it
(:attr:`scaffold_core.output.RunOutput.on_append`) and keeps both instead,
so the report reads only the lines it shows. The ledger stays the source: a
tally that does not describe it exactly (a resumed run's ledger, other ledgers
beside it, a line appended by another session) is not used, and the report
reads the ledgers as ``scaffold report`` does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..output.ledger import ledger_paths
from ..output.ledger_index import LedgerIndex
from .episodes import Stats


class RunTally:
    """The heads and ledger places of the records a run appends to ``ledger`` (which starts empty)."""

    def __init__(self, ledger: str | Path):
        self.ledger = Path(ledger)
        self.stats = Stats()
        self.index = LedgerIndex([self.ledger], self._count, scan=False)
        self.end = 0  # the ledger's size after the last record given
        self.whole = True  # every line was given, from byte 0 on

    def _count(self, head: dict[str, Any]) -> None:
        self.stats.add(self.stats.episodes, head)

    def add(self, record: dict[str, Any], offset: int, size: int) -> None:
        """One record appended to the ledger: its line of ``size`` bytes starts at ``offset``."""
        if not self.whole:
            return
        if offset != self.end or not self.index.note(0, offset, size, record):
            self.whole = False
            return
        self.end = offset + size

    def covers(self, directory: str | Path) -> bool:
        """Whether the tally describes the ledgers of ``directory`` exactly: its ledger is the only one and
        holds exactly the lines it was given."""
        if not self.whole or not self.index.exact:
            return False
        paths = ledger_paths(directory)
        try:
            return (len(paths) == 1 and os.path.samefile(paths[0], self.ledger)
                    and os.lstat(paths[0]).st_size == self.end)
        except OSError:
            return False

    def take(self, directory: str | Path) -> tuple[Stats, LedgerIndex] | None:
        """The counts and the completed index, when the tally :meth:`covers` ``directory`` (once)."""
        if not self.covers(directory):
            return None
        self.whole = False
        self.index.complete()
        return self.stats, self.index
