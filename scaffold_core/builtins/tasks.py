"""Built-in tasks: dataset (prompts and answers from any Hugging Face ``datasets`` source)."""

from __future__ import annotations

from ..plugins.markers import hookimpl


@hookimpl
def register_tasks(registry):
    from .dataset_task import DatasetTask

    registry.add("dataset", DatasetTask)
