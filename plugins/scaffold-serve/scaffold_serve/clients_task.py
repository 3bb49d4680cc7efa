"""The ``clients`` task: what ``scaffold serve`` runs when its config names only an engine.

A server's prompts come from its clients, so the task has no rows; rewards come from the clients
(or a grader) posting them to ``/sessions/{id}/reward``. A session that gets only an answer stays
unscored (never 0): there is no task verifier to score it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from scaffold_core.task import Task

NAME = "clients"


class ClientsTask(Task):
    """No rows: the prompts are the clients'. (``scaffold run`` with it has nothing to run.)"""

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "exact_match"}}

    def load(self):
        raise ValueError("the clients task has no rows: it is scaffold serve's, whose prompts come from its clients; "
                         "name a task with data for scaffold run")

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        raise ValueError("the clients task renders no prompts: its clients send them")
