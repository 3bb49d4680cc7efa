"""A plugin with test and benchmark tasks, for runs that need no dataset plugin.

Not registered by default. Enable it with
``SCAFFOLD_EXTRA_PLUGINS=scaffold_core.testing.plugin`` (worker processes
inherit the variable) or ``plugin_set(scaffold_core.testing.plugin)``.

* ``list``: :class:`~scaffold_core.testing.ListTask` over the ``rows`` given
  in the config (each with ``question``, ``answer`` and optionally ``id``).
* ``arithmetic``: ``count`` deterministic addition questions
  (``What is 17 + 25?`` -> ``42``), ids ``arith-00000``...
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable

from ..hookimpl import hookimpl
from .helpers import ListTask


class ConfiguredListTask(ListTask):
    """``list``: the rows come from the config. Defaults to the exact_match verifier."""

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "exact_match"},
                                                "sampling": {"max_tokens": 32}}

    def __init__(self, rows: list[dict[str, Any]] | None = None, system: str | None = None):
        super().__init__(rows, system)


class ArithmeticTask(ListTask):
    """``arithmetic``: ``count`` addition questions, the same for every process that builds them."""

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "exact_match"},
                                                "sampling": {"max_tokens": 32}}

    def __init__(self, count: int = 16, seed: int = 0, system: str | None = None):
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        super().__init__([], system)
        self.count = count
        self.seed = seed

    def load(self) -> Iterable[dict[str, Any]]:
        for i in range(self.count):
            a = (i * 7919 + self.seed * 104729) % 90 + 10
            b = (i * 104723 + self.seed * 7907) % 90 + 10
            yield {"id": f"arith-{i:05d}", "question": f"What is {a} + {b}?", "answer": str(a + b)}


@hookimpl
def register_tasks(registry: Any) -> None:
    registry.add("list", ConfiguredListTask)
    registry.add("arithmetic", ArithmeticTask)
