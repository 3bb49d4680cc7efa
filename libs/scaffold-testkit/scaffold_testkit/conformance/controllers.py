"""Conformance tests for controllers: clone isolation, concurrency, outcomes, failures (see also isolation.py)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from scaffold_core.sampling import SamplingParams

from ._common import ComponentConformance
from .isolation import ControllerIsolationChecks


def arithmetic_rows(n: int = 6) -> list[dict[str, Any]]:
    """Rows ``What is a + b?`` with their answers, for controller tests."""
    return [{"id": f"q{i}", "question": f"What is {i} + {i + 3}?", "answer": str(2 * i + 3)} for i in range(n)]


def right_or_wrong(prompt: str, request: Any) -> str:
    """Answer the last ``a + b`` in the prompt, correctly for two seeds in three and off by one otherwise."""
    found = re.findall(r"(\d+) \+ (\d+)", prompt)
    if not found:
        return "no question"
    a, b = map(int, found[-1])
    return str(a + b + (1 if (request.seed or 0) % 3 == 0 else 0))


class ControllerConformance(ControllerIsolationChecks, ComponentConformance):
    """Subclass this in your plugin's tests to check a controller against the controller contract.

    Set ``name``/``plugin`` (or override :meth:`make_controller`)::

        class TestMyController(ControllerConformance):
            plugin = scaffold_mycontroller
            name = "mycontroller"
            options = {"samples": 3}

    Episodes run through the real :class:`~scaffold_core.Runtime` against a
    :class:`~scaffold_testkit.ScriptedEngine` answering :meth:`respond`
    (right for two seeds in three, wrong otherwise) with random delays, on
    :meth:`make_task` rows, scored by :meth:`make_verifier`. Override those
    for controllers that need other prompts (a multi-turn chat, tools).

    The isolation tests (:class:`~scaffold_testkit.conformance.isolation.ControllerIsolationChecks`)
    subclass the controller the way a user would, adding mutable state, and
    run ``isolation_episodes`` (1,000) episodes at once, and
    ``isolation_branches`` (8) parallel branches per episode that each edit
    their row, messages and state: no episode or branch may see another's.
    """

    kind: ClassVar[str] = "controller"
    #: Rows of the default task (``question``/``answer``).
    rows: ClassVar[Sequence[dict[str, Any]]] = tuple(arithmetic_rows())
    #: Sampling of every episode.
    sampling: ClassVar[SamplingParams] = SamplingParams(max_tokens=64, temperature=1.0, seed=7)
    #: Upper bound of the scripted engine's random per-request delay, in seconds.
    max_delay: ClassVar[float] = 0.005
    #: Attributes a clone may share with its prototype even though they are mutable (read-only tables).
    shared_attributes: ClassVar[Sequence[str]] = ()
    #: Whether the controller is allowed to recover from engine errors (else they fail the episode).
    handles_engine_errors: ClassVar[bool] = False
    #: Seconds the episodes of one test may take.
    timeout: ClassVar[float] = 120.0

    def make_controller(self) -> Any:
        """The prototype controller under test (default: built by ``name`` through the registry)."""
        return self.build()

    def make_task(self) -> Any:
        from ..helpers import ListTask

        return ListTask(list(self.rows))

    def make_verifier(self) -> Any:
        from scaffold_core.builtins.verifiers import ExactMatchVerifier

        return ExactMatchVerifier()

    def respond(self, prompt: str, request: Any) -> str:
        """What the scripted engine answers to ``prompt`` (the rendered prompt text)."""
        return right_or_wrong(prompt, request)

    def make_engine(self, **options: Any) -> Any:
        from ..engines import ScriptedEngine

        return ScriptedEngine(self.respond, delay=(0.0, self.max_delay), **options)

    def run(self, controller: Any = None, *, concurrency: int = 8, engine: Any = None, seed: int = 0,
            **options: Any) -> list[Any]:
        """Run every row through the runtime; returns the EpisodeResults in row order (``options`` go to
        :func:`~scaffold_testkit.run_episodes`: runtime timeouts, a loop ``monitor``)."""
        from scaffold_core.builtins.trajectories import SingleTurnTrajectoryMaker

        from ..helpers import make_contexts, run_episodes

        engine = engine or self.make_engine(seed=seed)
        contexts = make_contexts(self.make_task(), engine.tokenizer, self.sampling)
        return run_episodes(contexts, engine=engine, controller=controller or self.make_controller(),
                            verifier=self.make_verifier(), trajectory_maker=SingleTurnTrajectoryMaker(),
                            **{"timeout": self.timeout, **options}, concurrency=concurrency)

    # -- tests -----------------------------------------------------------
    def test_clone_is_a_new_controller(self) -> None:
        """``clone()`` returns a different object of the same type."""
        prototype = self.make_controller()
        twin = prototype.clone()
        assert twin is not prototype
        assert type(twin) is type(prototype)

    def test_clone_shares_no_mutable_state(self) -> None:
        """A clone shares no list, dict, set or sub-controller with its prototype."""
        from scaffold_core._cloning import shared_names

        prototype = self.make_controller()
        allowed = set(self.shared_attributes) | set(shared_names(type(prototype)))  # declared shared handles
        shared = _shared_mutables(prototype, prototype.clone(), type(prototype).__name__, allowed)
        assert not shared, (
            f"clone() shares mutable state with the prototype: {', '.join(shared)}. Copy it in clone() "
            "(sub-controllers: call their clone()), or list read-only tables in `shared_attributes`")

    def test_process_is_a_generator(self) -> None:
        """``process(ctx)`` is a generator function (the runtime drives it with send/throw)."""
        from ..engines import ScriptedEngine
        from ..helpers import make_contexts

        controller = self.make_controller().clone()
        ctx = make_contexts(self.make_task(), ScriptedEngine().tokenizer, self.sampling)[0]
        gen = controller.process(ctx)
        try:
            assert inspect.isgenerator(gen), f"process() returned {type(gen).__name__}; write it with yield"
        finally:
            if inspect.isgenerator(gen):
                gen.close()

    def test_episodes_complete(self) -> None:
        """Every episode finishes ``ok`` with verified samples whose tokens and logprobs line up."""
        results = self.run()
        assert len(results) == len(self.rows)
        for result in results:
            assert result.ok, f"episode {result.episode_id} failed: {result.error_component}: {result.error}"
            assert result.samples, f"episode {result.episode_id} returned no samples"
            assert result.chosen is None or 0 <= result.chosen < len(result.samples)
            for sample in result.samples:
                assert sample.verdict is not None, "every sample is verified by the end of the episode"
                assert len(sample.output_ids) == len(sample.output_logprobs) == len(sample.output_mask)
                assert sample.versions is None or len(sample.versions) == len(sample.output_ids)
            for traj in result.trajectories:
                traj.check()

    def test_prototype_unchanged_by_episodes(self) -> None:
        """Running episodes (on clones) leaves the prototype exactly as it was."""
        prototype = self.make_controller()
        before = _snapshot(prototype)
        self.run(prototype)
        assert _snapshot(prototype) == before, "running episodes changed the prototype controller"

    def test_concurrency_does_not_change_results(self) -> None:
        """Episodes run 8 at a time (interleaved by random delays) give what they give one at a time."""
        serial = [_summary(r) for r in self.run(concurrency=1, seed=1)]
        concurrent = [_summary(r) for r in self.run(concurrency=8, seed=2)]
        assert concurrent == serial, "results depend on which episodes run together: state leaks between episodes"

    def test_repeated_runs_are_reproducible(self) -> None:
        """The same prototype run twice gives the same results (no state carried between runs)."""
        prototype = self.make_controller()
        assert [_summary(r) for r in self.run(prototype)] == [_summary(r) for r in self.run(prototype)]

    def test_engine_failure_fails_the_episode(self) -> None:
        """When the engine fails, episodes are reported failed: never ok with a silent zero reward."""
        if self.handles_engine_errors:
            return
        engine = self.make_engine(fail=lambda prompt: True)
        for result in self.run(engine=engine):
            assert result.status == "failed", f"episode {result.episode_id} is {result.status} after engine errors"
            assert result.error_component == "engine", result.error


    # -- what the built-ins guarantee: no class-level state, a free event loop, bounded waits ------------
    def test_episodes_leave_class_state_unchanged(self) -> None:
        """Running episodes changes no class-level container of the controller's classes (shared by every
        instance and clone, such state would carry data between episodes and runs)."""
        prototype = self.make_controller()
        self.assert_class_state_unchanged(prototype, lambda: self.run(prototype), "running episodes")

    def test_does_not_block_the_event_loop(self) -> None:
        """``process`` never holds the event loop for more than ``max_loop_block`` seconds at a time (every
        episode of a run shares that loop)."""
        from ..live import LoopLagMonitor
        from ._common import least_block

        def measure() -> float:
            monitor = LoopLagMonitor()
            self.run(monitor=monitor)
            return monitor.max_block

        blocked = least_block(measure, self.max_loop_block)
        assert blocked <= self.max_loop_block, (
            f"the controller held the event loop for {blocked:.3f} s at once (bound: max_loop_block = "
            f"{self.max_loop_block:g} s), stalling every other episode. Do not sleep or do heavy work in "
            "process(): yield GenerationTask/VerificationTask/AwaitTask and let the runtime wait")

    def test_hung_engine_fails_episodes_within_the_timeouts(self) -> None:
        """With an engine that never answers, every episode ends within ``rollout.episode_timeout`` (plus a
        margin), failed with component ``engine`` or ``timeout``: timeouts are never swallowed."""
        import time

        engine = self.make_engine(hang=lambda prompt: True)
        started = time.monotonic()
        results = self.run(engine=engine, request_timeout=0.2, episode_timeout=3.0, timeout=60.0)
        elapsed = time.monotonic() - started
        assert elapsed < 3.0 * 2 + 10.0, f"episodes against a hung engine took {elapsed:.1f} s"
        for result in results:
            if self.handles_engine_errors and result.ok:
                continue
            assert result.status == "failed" and result.error_component in ("engine", "timeout"), (
                f"episode {result.episode_id} is {result.status} ({result.error_component}: {result.error}) with a "
                "hung engine: a controller must let request timeouts fail the episode (or set "
                "handles_engine_errors when it recovers on purpose)")


def _summary(result: Any) -> Any:
    return (result.episode_id, result.status, result.error_component, result.chosen, result.answer,
            result.answer_reward, sorted(result.metrics.items()),
            [(s.sample_index, s.text, s.output_ids, s.reward) for s in result.samples])


def _is_controller(value: Any) -> bool:
    return callable(getattr(value, "process", None)) and callable(getattr(value, "clone", None))


def _attributes(obj: Any) -> dict[str, Any]:
    out = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if hasattr(obj, slot):
                out.setdefault(slot, getattr(obj, slot))
    return out


def _shared_mutables(a: Any, b: Any, path: str, allowed: set[str], depth: int = 0) -> list[str]:
    found: list[str] = []
    if depth > 8:
        return found
    theirs = _attributes(b)
    for key, mine in _attributes(a).items():
        if key in allowed:
            continue
        other = theirs.get(key)
        where = f"{path}.{key}"
        if isinstance(mine, (list, dict, set, bytearray)) and mine is other:
            found.append(where)
        elif _is_controller(mine):
            found += [where] if mine is other else _shared_mutables(mine, other, where, allowed, depth + 1)
        elif isinstance(mine, tuple) and isinstance(other, tuple):
            for i, (x, y) in enumerate(zip(mine, other)):
                if _is_controller(x):
                    here = f"{where}[{i}]"
                    found += [here] if x is y else _shared_mutables(x, y, here, allowed, depth + 1)
    return found


def _snapshot(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Any:
    """A comparable picture of an object graph (values, not identities of containers)."""
    seen = set() if seen is None else seen
    if isinstance(obj, (str, int, float, bool, bytes, type(None))):
        return obj
    if depth > 8 or id(obj) in seen:
        return f"<{type(obj).__qualname__}>"
    seen = seen | {id(obj)}
    if isinstance(obj, (list, tuple)):
        return [type(obj).__name__, [_snapshot(x, depth + 1, seen) for x in obj]]
    if isinstance(obj, dict):
        return {repr(k): _snapshot(v, depth + 1, seen) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return sorted(repr(x) for x in obj)
    attrs = _attributes(obj)
    if attrs:
        return {"__type__": type(obj).__qualname__, **{k: _snapshot(v, depth + 1, seen) for k, v in attrs.items()}}
    return repr(obj)
