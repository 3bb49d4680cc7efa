"""The hooks scaffold calls, and what plugins implement.

A plugin is a module (or object) whose functions are decorated with
``scaffold_core.hookimpl`` (``from scaffold_core import hookimpl``) and whose names match the specs below. It is found
through the ``scaffold`` entry-point group::

    [project.entry-points.scaffold]
    arith = "scaffold_arith"

Implementations may accept fewer arguments than the spec lists (pluggy's
opt-in arguments), so specs can grow without breaking plugins.

There are two families of hooks:

* **Registration hooks** (``register_*``) contribute named components. Each
  receives a core-owned ``registry`` bound to one component kind; call
  ``registry.add(name, factory)``. The core calls every implementation once per
  process, when the registry is first built. A plugin that raises here is
  listed with status ``error`` and its components are unavailable; every other
  plugin keeps working. A name another plugin (or a built-in) also registers
  for the same kind is a clash: neither wins, and configs must choose one
  with ``plugin:name``.
* **Lifecycle hooks** let several plugins take part in one step at once:
  observing finished episodes, wrapping engine requests for tracing and
  metrics, and seeing a run start and end. An exception raised by an observer
  is logged with the plugin's name and counted (``hook_errors``) and never
  corrupts another plugin's work; an ``engine_request`` wrapper that raises
  fails its request's episode.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from .markers import hookspec

if TYPE_CHECKING:  # imported for annotations only; keeps `scaffold list-plugins` fast
    from ..episode import EpisodeResult
    from ..generation import GenerationRequest, GenerationResult
    from .registry import ComponentRegistry


# --------------------------------------------------------------------------
# Registration hooks: called once per process when the registry is built.
# --------------------------------------------------------------------------


@hookspec
def register_tasks(registry: ComponentRegistry) -> None:
    """Register tasks: a dataset loader plus a prompt builder.

    :param registry: the task registry. Call ``registry.add(name, factory)``
        where ``factory(**options)`` builds a :class:`scaffold_core.Task`.
        ``options`` are the keys of the config's ``task:`` section other than
        ``name``; they are validated against the factory's signature and type
        annotations before anything is built.

    A task may declare ``default_config`` (a dict with ``sampling``,
    ``verifier`` and ``controller`` sections) that the config resolves under
    the user's explicit values.

    Example::

        @hookimpl
        def register_tasks(registry):
            registry.add("gsm8k", GSM8KTask)
    """


@hookspec
def register_controllers(registry: ComponentRegistry) -> None:
    """Register controllers: generators that decide what to generate and verify.

    :param registry: the controller registry; ``registry.add(name, factory)``
        where ``factory(**options)`` returns a :class:`scaffold_core.Controller`.

    The runtime clones the configured controller once per episode (before
    anything awaits), so per-episode state kept on ``self`` never leaks
    between episodes.
    """


@hookspec
def register_verifiers(registry: ComponentRegistry) -> None:
    """Register reward verifiers: score a response against a reference answer.

    :param registry: the verifier registry; ``registry.add(name, factory)``
        where ``factory(**options)`` returns a :class:`scaffold_core.Verifier`.

    Verifiers run off the event loop with a timeout; their ``verify`` method
    must be thread-safe and free of per-call state on ``self``.
    """


@hookspec
def register_engines(registry: ComponentRegistry) -> None:
    """Register inference engines: generate tokens for token ids.

    :param registry: the engine registry; ``registry.add(name, factory)``
        where ``factory(**options)`` returns a :class:`scaffold_core.Engine`.

    Engines import heavy libraries (torch, HTTP clients) lazily, inside
    ``start()``, never at module import time.
    """


@hookspec
def register_trajectory_makers(registry: ComponentRegistry) -> None:
    """Register trajectory makers: turn a finished episode into training samples.

    :param registry: the trajectory-maker registry; ``registry.add(name,
        factory)`` where ``factory(**options)`` returns a
        :class:`scaffold_core.TrajectoryMaker`.
    """


@hookspec
def register_environments(registry: ComponentRegistry) -> None:
    """Register environments for multi-turn controllers (the user side of a conversation).

    :param registry: the environment registry; ``registry.add(name, factory)``
        where ``factory(**options)`` returns an environment object (see the
        protocol below).

    The protocol (:mod:`scaffold_core.environment`): ``reset(ctx) -> state``
    once per conversation, ``step(state, response) -> EnvStep`` after each
    assistant turn (a plain function, a generator yielding runtime tasks, or
    ``async``), optional ``async start()``/``close()``. Per-conversation data
    lives in the state, never on the shared environment object. A controller
    selects one with ``environment: {name: ..., options...}``.
    """


@hookspec
def register_tools(registry: ComponentRegistry) -> None:
    """Register tools an agent controller may call.

    :param registry: the tool registry; ``registry.add(name, factory)`` where
        ``factory(**options)`` returns a :class:`scaffold_core.tool.Tool`: a
        ``description``, a JSON Schema of its arguments (``parameters``) and an
        ``async call(arguments, context) -> ToolResult``.

    A controller selects tools by name with their options, e.g.
    ``controller: {name: agent, tools: [calculator, {name: search, top_k: 3}]}``.
    Calls go through :func:`scaffold_core.tool.invoke_tool`, which validates the
    arguments, bounds the call by the tool's timeout and turns every failure
    into an error result the model reads. Per-episode data lives in the call's
    ``context.state``, never on the tool object.
    """


@hookspec
def register_tool_formats(registry: ComponentRegistry) -> None:
    """Register tool-call formats: how an agent shows tools to the model, reads its calls and returns results.

    :param registry: the tool-format registry; ``registry.add(name, factory)``
        where ``factory(**options)`` returns a
        :class:`scaffold_core.tool_format.ToolFormat`: ``prompt(messages,
        tools, tokenizer)`` (the messages and chat-template arguments that
        present the tools), ``parse(text)`` (the calls in one model turn, a
        malformed one as a call with ``error`` set, never an exception) and
        ``result_messages(calls, results)`` (the messages that carry the
        results back).

    A controller selects one by name with its options, e.g.
    ``controller: {name: agent, format: {name: hermes}}``. One format object
    serves every episode: keep no per-episode data on it.
    """


@hookspec
def register_trainers(registry: ComponentRegistry) -> None:
    """Register trainers: what ``scaffold train`` runs (an RL trainer consuming scaffold's rollouts).

    :param registry: the trainer registry; ``registry.add(name, factory)``
        where ``factory(**options)`` returns a :class:`scaffold_core.trainer.Trainer`
        (``train(job) -> summary``). ``options`` are the keys of the config's
        ``trainer:`` section other than ``name``.

    Factories must be cheap (the config builds one to validate its options):
    import the training library inside ``train``. The trainer builds its
    rollouts from ``job.config``, usually with
    :class:`scaffold_core.train.prompt_groups.TrainingRollouts`, and reports each
    optimizer step with ``job.report(TrainStep(...))``.
    """


@hookspec
def plugin_notes() -> list[str]:  # type: ignore[empty-body]  # a spec: pluggy never runs its body
    """Lines about this plugin's state on this machine, which ``scaffold list-plugins`` prints under its
    table (and ``--json`` gives as the plugin's ``notes``): what a user should know before a run, such as
    which isolation or limits a tool will have here, or an optional dependency that is missing::

        @hookimpl
        def plugin_notes():
            return ["python tool: bubblewrap jail; whole-jail limits: a cgroup v2 per call"]

    Keep it quick (``list-plugins`` must stay fast): no model, no network, no process that may hang. An
    exception is shown as the note instead.
    """


@hookspec
def register_commands(subparsers: Any) -> None:
    """Add ``scaffold`` subcommands (simonw/llm's ``register_commands``, datasette's ``publish_subcommand``).

    :param subparsers: the ``argparse`` sub-parsers action of the ``scaffold`` command line. Call
        ``subparsers.add_parser(name, help=...)``, add the command's arguments, and set its handler with
        ``parser.set_defaults(handler=function)``; ``function(args)`` runs the command and returns its exit
        code (``None`` counts as 0). A :class:`scaffold_core.errors.ScaffoldError` it raises is printed as
        ``error: ...`` with exit code 1, as for the core's own commands.

    Keep it quick (every ``scaffold`` invocation builds the parser): import what the command needs inside
    its handler. A command name already taken (by the core or another plugin) is skipped with a warning; a
    plugin that raises here loses its commands and nothing else::

        @hookimpl
        def register_commands(subparsers):
            p = subparsers.add_parser("serve", help="serve the config's engine")
            p.add_argument("config")
            p.set_defaults(handler=serve)
    """


# --------------------------------------------------------------------------
# Lifecycle hooks: several plugins may implement each; all are called.
# --------------------------------------------------------------------------


@hookspec
def on_run_start(config: Any, output_dir: str | None) -> None:
    """Called once per process that runs episodes, before its first episode and before the engine
    starts (in a multi-worker, torchrun or Ray run: in every worker).

    :param config: the resolved :class:`scaffold_core.config.Config`.
    :param output_dir: the directory the run writes its files to (``scaffold run``
        always passes one).

    An exception is logged with the plugin's name and counted in the run's
    ``metrics.json`` (``hook_errors``); the run goes on.
    """


@hookspec
def on_episode_end(result: EpisodeResult) -> None:
    """Called on the event loop each time an episode finishes, failed ones included.

    :param result: the :class:`scaffold_core.EpisodeResult`: episode id,
        status (``"ok"`` or ``"failed"``), error, samples with rewards, the
        episode's answer. Treat it as read-only.

    Called after the episode's retries, also for an episode that failed before
    it ran (a row whose prompt could not be built). Keep implementations fast
    (they run on the event loop). An exception is logged with the plugin's
    name and counted in the run's ``metrics.json`` (``hook_errors``); it does
    not fail the episode or stop other observers.
    """


@hookspec
def on_run_end(metrics: dict, output_dir: str | None) -> None:
    """Called once per run, after the last episode, when every output file and ``metrics.json`` are
    written: in the process of a one-process run, in the launcher (after merging the workers'
    results) of a multi-worker or Ray run, on rank 0 under torchrun.

    :param metrics: the run's metrics dict (what ``metrics.json`` holds).
    :param output_dir: the run's output directory.

    An exception is logged with the plugin's name, counted in ``hook_errors``, and
    ``metrics.json`` is written again with the count.
    """


@hookspec(firstresult=True)
def run_reporter() -> Any:
    """The reporter that writes ``report.html`` at the end of ``scaffold run`` and ``scaffold train`` (the first
    plugin that returns one is used; ``--no-report`` asks none). Called once per command, before the run starts.

    Return an object with ``write(directory, tokenizer=None)``, called when the run's files are complete, and
    optionally ``count(head)``, called with each episode's record (without its token arrays) in order as a
    one-process run exports its files, so a large run is not read twice. ``tokenizer``: the engine's, when it ran
    in this process. ``write`` must not raise for a report it cannot write: the run's own files are complete
    either way, so it says why and how to write the report later::

        @hookimpl
        def run_reporter():
            return MyReporter()
    """


@hookspec
def engine_request(  # type: ignore[empty-body]  # a spec: pluggy never runs its body
    request: GenerationRequest, engine: str
) -> Generator[None, GenerationResult, GenerationResult]:
    """Wrap every request sent to an engine: for tracing, metrics, or rewriting.

    Implementations **must** be new-style wrappers (``@hookimpl(wrapper=True)``)
    with exactly one ``yield``. The code before ``yield`` runs when the request
    is sent; ``yield`` returns the engine's :class:`GenerationResult` once it
    arrives (the request is awaited in between, so this works for async
    engines, bounded by ``rollout.request_timeout``); return the result, or a
    replacement (``None`` keeps the result). If the engine fails or times out,
    ``yield`` raises the error, which the wrapper may observe; the error fails
    the request whatever the wrapper does::

        @hookimpl(wrapper=True)
        def engine_request(request, engine):
            start = time.perf_counter()
            result = yield
            record(engine, time.perf_counter() - start, len(result.output_ids))
            return result

    :param request: the :class:`GenerationRequest` (prompt ids, sampling
        parameters, request and episode ids). Treat it as read-only.
    :param engine: the engine's registered name (without a ``plugin:`` qualifier).

    A wrapper that raises (before or after its ``yield``) fails that request's
    episode with component ``plugin:NAME`` and an error naming the plugin; it is
    not retried.
    """
