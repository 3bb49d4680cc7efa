"""scaffold-datasets: the ``dataset`` task, any Hugging Face ``datasets`` source (local JSON lines, CSV, parquet, or
the hub) as prompts and reference answers, in every shape of chat data (``task``). A default plugin.

Tasks that read a dataset their own way build on it: ``from scaffold_datasets import DatasetTask, json_value``.
``datasets`` is imported only when rows are read.
"""

from __future__ import annotations

from scaffold_core import hookimpl
from scaffold_core.plugins import lazy_exports

__version__ = "0.1.0"

#: The public API other plugins build on, loaded on first use. Everything else in this package is private.
PUBLIC = {"DatasetTask": "task", "json_value": "task"}

__getattr__ = lazy_exports(__name__, PUBLIC)


@hookimpl
def register_tasks(registry):
    from .task import DatasetTask

    registry.add("dataset", DatasetTask)
