"""scaffold-serve: an OpenAI-compatible endpoint over any scaffold engine, recording token-faithful trajectories.

* ``scaffold serve CONFIG``: the endpoint over the config's engine (:mod:`scaffold_serve.cli`).
* controller ``openai_agent`` (:class:`scaffold_serve.controller.OpenAIAgentController`): runs
  user agent code ``solve(row, client)`` with an OpenAI client bound to a fresh session per
  episode (and per branch), so ordinary agent programs become training data.

The modules: :mod:`~scaffold_serve.wire` (request checking, errors), :mod:`~scaffold_serve.render`
(OpenAI messages to the tool-call formats of scaffold-multiturn), :mod:`~scaffold_serve.trajectory`
and :mod:`~scaffold_serve.session` (the prefix invariant, forks, drift), :mod:`~scaffold_serve.service`
(sessions, sampling, context), :mod:`~scaffold_serve.backends` (engine or runtime),
:mod:`~scaffold_serve.app` (HTTP), :mod:`~scaffold_serve.server` (uvicorn) and
:mod:`~scaffold_serve.episodes` (the run's endpoint and an episode's sessions, shared by every controller
that runs agent code). Heavy imports
(starlette, uvicorn, openai) happen only when a server or an agent starts.
"""

from __future__ import annotations

from scaffold_core import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_controllers(registry):
    from .controller import OpenAIAgentController

    registry.add("openai_agent", OpenAIAgentController)


@hookimpl
def register_tasks(registry):
    from .clients_task import ClientsTask

    registry.add("clients", ClientsTask)
