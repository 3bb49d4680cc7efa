"""Registries, tasks and runners for tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from scaffold_core.episode import EpisodeContext, EpisodeResult
from scaffold_core.plugins import PluginSet
from scaffold_core.run.assembly import Components, Limits, started
from scaffold_core.run.runtime import Runtime
from scaffold_core.sampling import SamplingParams
from scaffold_core.task import Task, episode_context
from scaffold_core.verifier import Reference


def build(factory: Any, **options: Any) -> Any:
    """A component built as a config builds it: ``options`` validated against the factory's declaration first.

    Out-of-bounds or unknown options raise the same :class:`~scaffold_core.errors.ConfigError` a config gets.
    """
    from scaffold_core.plugins.options import validate_options

    name = getattr(factory, "__name__", "component")
    return factory(**validate_options(factory, options, path=name, label=name))


#: The default plugins every installation of scaffold has (`make setup` installs them with the core): entry-point
#: name -> module. A test's plugin set gets those installed, as a user's run does, without reading entry points.
DEFAULT_PLUGINS = {"transformers": "scaffold_transformers", "datasets": "scaffold_datasets",
                   "report": "scaffold_report"}


def default_plugins() -> dict[str, Any]:
    """The installed default plugins' modules by entry-point name (those not installed are left out)."""
    import importlib
    import importlib.util

    return {name: importlib.import_module(module) for name, module in DEFAULT_PLUGINS.items()
            if importlib.util.find_spec(module) is not None}


def plugin_set(*plugins: Any, entry_points: bool = False, defaults: bool = True, **named: Any) -> PluginSet:
    """A fresh PluginSet with the built-ins, the installed default plugins (``defaults``; with ``entry_points`` they
    come from there), ``plugins`` (auto-named) and ``named`` plugins registered."""
    given = [*plugins, *named.values()]
    extra = {name: module for name, module in (default_plugins() if defaults and not entry_points else {}).items()
             if not any(module is p for p in given)}  # a default plugin under test is registered once, as given
    extra.update({f"test-plugin-{i}": p for i, p in enumerate(plugins)})
    extra.update(named)
    return PluginSet().load(entry_points=entry_points, extra=extra)


class ListTask(Task):
    """A task over in-memory rows with ``question`` and ``answer`` fields."""

    def __init__(self, rows: list[dict[str, Any]] | None = None, system: str | None = None):
        super().__init__()
        self.rows = list(rows or [])
        self.system = system

    def load(self) -> Iterable[dict[str, Any]]:
        return list(self.rows)

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": str(row["question"])}]

    def reference(self, row: dict[str, Any]) -> Reference:
        answer = row.get("answer")
        return None if answer is None else str(answer)


def make_contexts(task: Task, tokenizer: Any, sampling: SamplingParams | None = None) -> list[EpisodeContext]:
    sampling = sampling or SamplingParams(max_tokens=64)
    return [episode_context(task, i, row, tokenizer, sampling) for i, row in enumerate(task.load())]


#: The run_episodes options that are :class:`~scaffold_core.run.assembly.Limits` fields.
LIMIT_OPTIONS = ("concurrency", "request_timeout", "episode_timeout", "retries")


def run_episodes(contexts: list[EpisodeContext], *, engine: Any, controller: Any, verifier: Any = None,
                 trajectory_maker: Any = None, timeout: float = 120.0, verifier_timeout: float = 10.0,
                 monitor: Any = None, **runtime_options: Any) -> list[EpisodeResult]:
    """Run ``contexts`` and return results in context order (the whole call is bounded by ``timeout``).

    ``runtime_options``: the :class:`~scaffold_core.run.runtime.Runtime`'s keyword arguments, and the
    :class:`~scaffold_core.run.assembly.Limits` fields ``concurrency``, ``request_timeout``,
    ``episode_timeout`` and ``retries``.

    ``monitor`` (a :class:`~scaffold_testkit.live.LoopLagMonitor`) watches the event loop the
    episodes run on, while they run.

    ``engine`` is an unstarted engine (started and closed here, on a fresh
    event loop) or a :class:`~scaffold_testkit.LiveEngine` (used on its
    own loop and left running, e.g. the session's shared model engine).
    """
    from .live import LiveEngine

    live = engine if isinstance(engine, LiveEngine) else None
    raw_engine = live.engine if live is not None else engine

    limits = Limits(verifier_timeout=verifier_timeout, **{key: runtime_options.pop(key) for key in LIMIT_OPTIONS
                                                         if key in runtime_options})
    components = Components(task=None, controller=controller, engine=raw_engine, verifier=verifier,
                            trajectory_maker=trajectory_maker)

    async def main() -> list[EpisodeResult]:
        results: list[EpisodeResult] = []
        async with started(components, limits, manage_engine=live is None, verifier_name="verifier") as pool:
            runtime = Runtime(engine=raw_engine, controller=controller, verifier=pool,
                              trajectory_maker=trajectory_maker, limits=limits, **runtime_options)
            if monitor is None:
                await asyncio.wait_for(runtime.run(contexts, results.append), timeout)
            else:
                async with monitor:
                    await asyncio.wait_for(runtime.run(contexts, results.append), timeout)
        order = {c.episode_id: i for i, c in enumerate(contexts)}
        return sorted(results, key=lambda r: order.get(r.episode_id, 0))

    if live is not None:
        return live.run(main(), timeout=timeout + 5.0)
    return asyncio.run(main())


def run_one_episode(task: Task, row: int | dict[str, Any] = 0, *, engine: Any = None, respond: Any = None,
                    controller: Any = None, verifier: Any = None, trajectory_maker: Any = None,
                    sampling: SamplingParams | None = None, timeout: float = 120.0) -> EpisodeResult:
    """Run one row of ``task`` end to end (prompt, generation, verification, trajectories).

    ``row`` is a row index into ``task.load()`` or a row dict. The engine
    defaults to a :class:`ScriptedEngine` answering ``respond`` (a string, or
    a function of the prompt text and request); the controller to ``native``;
    the trajectory maker to ``single_turn``. ``verifier`` is required when
    the episode should be scored. A real engine must be passed started, as a
    :class:`~scaffold_testkit.LiveEngine` (its tokenizer renders the prompt).
    """
    from scaffold_core.builtins.controllers import NativeController
    from scaffold_core.builtins.trajectories import SingleTurnTrajectoryMaker

    from .engines import ScriptedEngine

    if isinstance(row, int):
        rows = list(task.load())
        if not 0 <= row < len(rows):
            raise IndexError(f"row {row} is out of range: the task loaded {len(rows)} rows")
        row = rows[row]
    if engine is None:
        engine = ScriptedEngine(respond if respond is not None else "")
    tokenizer = engine.tokenizer
    one = _OneRowTask(task, row)
    contexts = make_contexts(one, tokenizer, sampling)
    results = run_episodes(contexts, engine=engine, controller=controller or NativeController(),
                           verifier=verifier, trajectory_maker=trajectory_maker or SingleTurnTrajectoryMaker(),
                           timeout=timeout)
    return results[0]


class _OneRowTask(Task):
    """A view of another task that loads only one row."""

    def __init__(self, task: Task, row: dict[str, Any]):
        super().__init__()
        self.task = task
        self.row = row

    def load(self) -> Iterable[dict[str, Any]]:
        return [self.row]

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return self.task.messages(row)

    def reference(self, row: dict[str, Any]) -> Reference:
        return self.task.reference(row)

    def build_prompt(self, row: dict[str, Any], tokenizer: Any) -> Any:
        return self.task.build_prompt(row, tokenizer)


#: How far a recorded span may stray past its episode's times: spans are kept to 0.1 ms.
SPAN_EPS = 2e-4


def check_spans(record: dict[str, Any]) -> None:
    """Assert that every span of an episode's record lies within its time (from its first span, a wait for its turn,
    to the end of its wall time) and that its phases' shares sum to that time."""
    from pytest import approx

    from scaffold_core.spans import exclusive

    spans = record["spans"]
    assert spans, record["episode_id"]
    start, end = record["started_s"], record["started_s"] + record["wall_s"]
    for phase, a, b, *_ in spans:
        assert a <= b, (phase, a, b)
        assert b <= end + SPAN_EPS, (record["episode_id"], phase, b, end)
        assert a >= start - SPAN_EPS or phase == "queued", (record["episode_id"], phase, a, start)
    parts = exclusive(spans, min(start, spans[0][1]), end)
    assert sum(parts.values()) == approx(end - min(start, spans[0][1]), abs=1e-6)
