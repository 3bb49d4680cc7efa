"""Isolation checks every controller plugin inherits: hidden state across episodes, data across branches.

:class:`ControllerIsolationChecks` is a base of
:class:`~scaffold_testkit.conformance.ControllerConformance`; its tests
need the knobs and builders that class defines (``make_controller``,
``make_task``, ``make_engine``, ``make_verifier``, ``sampling``,
``timeout``).

* **Hidden state.** The controller under test is subclassed the way a user
  would: the subclass adds mutable attributes (a list, a dict of lists, a
  set, a bytearray, a plain object holding a list) and overrides neither
  ``clone`` nor anything else the controller does; it only notes, in that
  state, which episode touched it. ``isolation_episodes`` episodes then run
  all at once on the scripted engine, with random delays interleaving them.
  Every episode must end having seen only its own notes (and those of the
  branch that cloned it), and the prototype must end with none.
* **Branches.** The controller under test runs as ``isolation_branches``
  parallel branches of one episode; each branch writes its own marks into
  its context's ``row``, ``messages`` and ``state`` (nested values
  included), waits while its siblings run, and must then find only its own
  marks; the episode's own context must be unchanged.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, ClassVar

#: Context keys the branch test writes (prefixed so no controller reads them by accident).
MARK = "_scaffold_isolation_mark"
MARKS = "_scaffold_isolation_marks"
LINEAGE = "_scaffold_isolation_lineage"
#: Sample numbers between two branches of the branch test (so their sample indices never overlap).
BRANCH_STRIDE = 1000


class _Notebook:
    """A plain object holding a list: mutable state one level down."""

    def __init__(self) -> None:
        self.pages: list[str] = []


def _add_hidden_state(controller: Any) -> None:
    controller.iso_seen = []
    controller.iso_by_episode = {}
    controller.iso_nested = {"episodes": []}
    controller.iso_set = set()
    controller.iso_bytes = bytearray()
    controller.iso_notebook = _Notebook()


def _note(controller: Any, mark: str) -> None:
    controller.iso_seen.append(mark)
    controller.iso_by_episode.setdefault(mark, []).append(len(controller.iso_seen))
    controller.iso_nested["episodes"].append(mark)
    controller.iso_set.add(mark)
    controller.iso_bytes.extend(mark.encode() + b"\n")
    controller.iso_notebook.pages.append(mark)


def _notes(controller: Any) -> set[str]:
    """Every mark found anywhere in the hidden state."""
    found = set(controller.iso_seen) | set(controller.iso_by_episode) | set(controller.iso_nested["episodes"])
    found |= controller.iso_set | set(controller.iso_notebook.pages)
    found |= {m for m in controller.iso_bytes.decode().split("\n") if m}
    return found


def _attributes(obj: Any) -> dict[str, Any]:
    out = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                out.setdefault(slot, getattr(obj, slot))
    return out


def user_subclass(controller: Any, report: list[tuple[str, list[str]]], *, mutate_context: bool = False) -> Any:
    """``controller`` as an instance of a user's subclass that adds mutable state and overrides no copying.

    Its ``process`` notes the episode (and branch) in the hidden state, runs
    the controller's own ``process`` unchanged, and appends ``(mark, marks of
    others it found)`` to ``report``. With ``mutate_context`` it also marks
    its context's row, messages and state, pauses so its siblings run, and
    reports any mark that is not its own.
    """
    base = type(controller)

    def process(self: Any, ctx: Any) -> Any:
        lineage = tuple(ctx.state.get(LINEAGE, ()))
        mark = f"{ctx.episode_id}@{ctx.sample_base}#{len(lineage)}"
        ctx.state[LINEAGE] = lineage + (mark,)
        _note(self, mark)
        if mutate_context:
            ctx.row[MARK] = mark
            ctx.row.setdefault(MARKS, []).append(mark)
            ctx.state[MARK] = mark
        outcome = yield from base.process(self, ctx)
        if mutate_context:
            if ctx.messages is not None:
                ctx.messages.append({"role": "user", "content": mark})
                ctx.messages[0].setdefault(MARKS, []).append(mark)
            delay = random.Random(mark).uniform(0.0, 0.003)
            from scaffold_core.generation import AwaitTask

            yield [AwaitTask(lambda: asyncio.sleep(delay), timeout=30.0, what="a pause for sibling branches")]
        problems = sorted(_notes(self) - set(lineage) - {mark})
        if mutate_context:
            problems += _context_problems(ctx, mark, lineage)
        report.append((mark, problems))
        return outcome

    subclass: Any = type(f"UserSubclassOf{base.__name__}", (base,), {"process": process, "__module__": __name__})
    instance = subclass.__new__(subclass)
    for name, value in _attributes(controller).items():
        object.__setattr__(instance, name, value)
    _add_hidden_state(instance)
    return instance


def _context_problems(ctx: Any, mark: str, lineage: tuple[str, ...]) -> list[str]:
    """What in this branch's context is not its own (its ancestors' row marks, made before it branched, are)."""
    problems = []
    if ctx.row.get(MARK) != mark:
        problems.append(f"row[{MARK!r}] is {ctx.row.get(MARK)!r}")
    if ctx.row.get(MARKS) != [*lineage, mark]:
        problems.append(f"row[{MARKS!r}] is {ctx.row.get(MARKS)!r}")
    if ctx.state.get(MARK) != mark:
        problems.append(f"state[{MARK!r}] is {ctx.state.get(MARK)!r}")
    if ctx.messages is not None:
        ours = [m.get("content") for m in ctx.messages if isinstance(m.get("content"), str)
                and "@" in m["content"] and m["content"].startswith(ctx.episode_id)]
        if ours != [mark]:
            problems.append(f"messages hold the marks {ours!r}")
        if ctx.messages[0].get(MARKS) != [mark]:
            problems.append(f"messages[0][{MARKS!r}] is {ctx.messages[0].get(MARKS)!r}")
    return problems


def fan_out(sub: Any, branches: int, report: list[tuple[str, list[str]]]) -> Any:
    """A controller running ``sub`` as ``branches`` parallel branches per episode; checks the episode's own context."""
    from scaffold_core.controller import Controller
    from scaffold_core.episode import Outcome

    class FanOut(Controller):
        def __init__(self) -> None:
            self.sub = sub

        def process(self, ctx: Any) -> Any:
            before = (repr(ctx.row), repr(ctx.messages), sorted(ctx.state))
            outcomes = yield self.parallel(self.sub, [ctx.branch(i * BRANCH_STRIDE) for i in range(branches)])
            after = (repr(ctx.row), repr(ctx.messages), sorted(ctx.state))
            if after != before:
                report.append((f"{ctx.episode_id} (the episode's own context)",
                               ["parallel branches changed the row, messages or state of the episode"]))
            samples = [s for outcome in outcomes for s in outcome.samples]
            return Outcome(samples=samples)

    return FanOut()


class ControllerIsolationChecks:
    """The isolation tests of :class:`~scaffold_testkit.conformance.ControllerConformance`."""

    #: Episodes run at once by the hidden-state test (each its own row copy, all in flight together).
    isolation_episodes: ClassVar[int] = 1000
    #: Parallel branches per episode in the branch test.
    isolation_branches: ClassVar[int] = 8
    #: Episodes of the branch test.
    isolation_branch_episodes: ClassVar[int] = 24

    def isolation_contexts(self, count: int, engine: Any) -> list[Any]:
        """``count`` episode contexts from :meth:`make_task`'s rows, repeated under new episode ids as needed."""
        from scaffold_core._cloning import copy_data

        from ..helpers import make_contexts

        task = self.make_task()  # type: ignore[attr-defined]
        contexts: list[Any] = []
        repeat = 0
        while len(contexts) < count:
            batch = make_contexts(task, engine.tokenizer, self.sampling)  # type: ignore[attr-defined]
            assert batch, "make_task() loaded no rows"
            for ctx in batch[: count - len(contexts)]:
                ctx.row = copy_data(ctx.row)  # a task may hand out the same row dict on every load()
                ctx.episode_id = f"{ctx.episode_id}~{repeat}"
                ctx.index = len(contexts)
                contexts.append(ctx)
            repeat += 1
        return contexts

    def _run_isolation(self, controller: Any, count: int, seed: int) -> list[Any]:
        from ..helpers import run_episodes

        engine = self.make_engine(seed=seed)  # type: ignore[attr-defined]
        contexts = self.isolation_contexts(count, engine)
        return run_episodes(contexts, engine=engine, controller=controller,
                            verifier=self.make_verifier(),  # type: ignore[attr-defined]
                            timeout=max(self.timeout, 300.0), concurrency=len(contexts))  # type: ignore[attr-defined]

    def test_hidden_state_is_isolated_across_concurrent_episodes(self) -> None:
        """A subclass adding mutable state (and overriding nothing) is isolated: 1,000 episodes at once, no leaks."""
        report: list[tuple[str, list[str]]] = []
        prototype = user_subclass(self.make_controller(), report)  # type: ignore[attr-defined]
        results = self._run_isolation(prototype, self.isolation_episodes, seed=5)
        failed = [r for r in results if not r.ok]
        assert not failed, (f"{len(failed)} of {len(results)} episodes failed, e.g. "
                            f"{failed[0].error_component}: {failed[0].error}")
        assert len(report) >= len(results), "the subclass's process() did not run for every episode"
        leaked = [(mark, found) for mark, found in report if found]
        assert not leaked, (
            f"{len(leaked)} of {len(report)} episodes (or branches) saw another episode's state in a subclass's "
            f"mutable attributes, e.g. {leaked[0][0]} saw {leaked[0][1][:3]}: clone() shares mutable state. "
            "Do not override clone() with a shallow copy; name shared handles in the class's `shared` tuple")
        assert not _notes(prototype), "episodes wrote into the prototype's own state"

    def test_parallel_branches_see_only_their_own_changes(self) -> None:
        """Parallel branches each mark their row, messages and state; each sees only its own marks."""
        report: list[tuple[str, list[str]]] = []
        sub = user_subclass(self.make_controller(), report, mutate_context=True)  # type: ignore[attr-defined]
        prototype = fan_out(sub, self.isolation_branches, report)
        results = self._run_isolation(prototype, self.isolation_branch_episodes, seed=6)
        failed = [r for r in results if not r.ok]
        assert not failed, (f"{len(failed)} of {len(results)} episodes failed, e.g. "
                            f"{failed[0].error_component}: {failed[0].error}")
        problems = [(mark, found) for mark, found in report if found]
        assert not problems, (
            f"{len(problems)} branches saw changes that were not their own, e.g. {problems[0][0]}: "
            f"{problems[0][1][:3]}")
        branches = [mark for mark, _ in report if mark.endswith("#0")]  # outermost branches (not nested ones)
        assert len(branches) == len(results) * self.isolation_branches, (
            f"expected {len(results) * self.isolation_branches} branches, saw {len(branches)}")
        for result in results:
            assert MARK not in (result.row or {}), "a branch's row change reached the episode's row"
