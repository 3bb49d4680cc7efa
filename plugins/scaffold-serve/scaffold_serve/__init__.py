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
from scaffold_core.plugins import lazy_exports

# The options every agent-running controller shares, declared once (other plugins' controllers take them too).
from .options import AgentSampling as AgentSampling
from .options import AgentTimeout as AgentTimeout
from .options import ContextLength as ContextLength
from .options import MaxCalls as MaxCalls

__version__ = "0.1.0"

#: The public API other plugins build on (an endpoint per run, sessions per episode, the agent options), loaded on
#: first use so that listing plugins stays fast. Everything else in this package is private.
PUBLIC = {"AgentEndpoint": "episodes", "EpisodeSessions": "episodes", "ServeOptions": "service"}

__getattr__ = lazy_exports(__name__, PUBLIC)


@hookimpl
def register_controllers(registry):
    from .controller import OpenAIAgentController

    registry.add("openai_agent", OpenAIAgentController)


@hookimpl
def register_tasks(registry):
    from .clients_task import ClientsTask

    registry.add("clients", ClientsTask)


@hookimpl
def register_commands(subparsers):
    from scaffold_core.run.arguments import add_override_arguments

    p = subparsers.add_parser("serve", help="serve the config's engine behind an OpenAI-compatible endpoint whose "
                                            "sessions record token-faithful trajectories")
    p.add_argument("config", help="YAML config file (its engine, sampling, verifier and trajectory maker)")
    add_override_arguments(p, "engine.threads=2")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; any other needs "
                                                      "--api-key)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000; 0 picks a free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request (default: "
                                     "$SCAFFOLD_API_KEY)")
    p.add_argument("-o", "--output", help="where finished sessions are written (default: output.dir)")
    p.set_defaults(handler=_serve)


def _serve(args):
    from .cli import serve

    return serve(args)
