"""Conformance tests for tools: a valid schema, bad arguments as error results, timeouts, no shared state."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from ._common import ComponentConformance, short


def _run(coro: Any, seconds: float) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, seconds)

    return asyncio.run(bounded())


def _wrong_type(schema: dict[str, Any]) -> Any:
    """A JSON value that does not match ``schema``'s type."""
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    for candidate in ({"unexpected": "object"}, ["a", "list"], "a string", 12345, True):
        if not _matches(candidate, kinds):
            return candidate
    return None


def _matches(value: Any, kinds: set[Any]) -> bool:
    names = {dict: "object", list: "array", str: "string", bool: "boolean"}
    name = names.get(type(value), "integer")
    return name in kinds or (name == "integer" and "number" in kinds) or None in kinds


class ToolConformance(ComponentConformance):
    """Subclass this in your plugin's tests to check a tool against the tool contract.

    Set ``name``/``plugin`` (or override :meth:`make_tool`) and give
    ``good_arguments``: argument objects a correct call uses::

        class TestMyTool(ToolConformance):
            plugin = scaffold_myplugin
            name = "lookup"
            good_arguments = [{"key": "pi"}]

    Every call goes through :func:`scaffold_core.tool.invoke_tool`, as an
    agent controller makes it. The checks: the definition passes
    ``check_tool`` and its spec is what chat templates take; arguments that
    break the schema (a required one missing, one of the wrong type, an
    unknown one when the schema forbids extras, text that is not JSON) come
    back as error results, never as exceptions; good calls succeed within
    ``time_limit`` and give the same content whatever other episodes do
    (``deterministic = False`` for tools whose output varies by design: the
    check then only compares ``ok``); ``slow_arguments`` (if given) make a
    call that outlasts a short timeout, which must come back as a
    ``timeout`` error promptly; copying the tool never copies per-episode
    state into it, and no class-level mutable attribute is written by calls.
    """

    kind: ClassVar[str] = "tool"
    #: Argument objects of calls that must succeed.
    good_arguments: ClassVar[Sequence[dict[str, Any]]] = ()
    #: Arguments of a call that takes longer than ``timeout_probe`` seconds (optional).
    slow_arguments: ClassVar[dict[str, Any] | None] = None
    #: The timeout used with ``slow_arguments``; the error must arrive within 10x of it.
    timeout_probe: ClassVar[float] = 0.2
    #: Seconds one good call may take.
    time_limit: ClassVar[float] = 30.0
    #: Whether the same arguments give the same content (compared across interleaved episodes).
    deterministic: ClassVar[bool] = True

    def make_tool(self) -> Any:
        """Build the tool under test (default: by ``name`` through the registry)."""
        return self.build()

    def _context(self, episode: str, call: str = "c0") -> Any:
        from ...tool import ToolContext

        return ToolContext(episode_id=episode, call_id=call, state={})

    async def _start(self, tool: Any) -> None:
        start = getattr(tool, "start", None)
        if start is not None:
            await start()

    async def _close(self, tool: Any) -> None:
        close = getattr(tool, "close", None)
        if close is not None:
            await close()

    def _calls(self, tool: Any, calls: list[tuple[Any, Any]], *, timeout: float | None = None) -> list[Any]:
        """Start the tool, run ``(arguments, context)`` calls concurrently through invoke_tool, close it."""
        return self._batches(tool, [calls], timeout=timeout)[0]

    def _batches(self, tool: Any, batches: list[list[tuple[Any, Any]]], *,
                 timeout: float | None = None) -> list[list[Any]]:
        """Start the tool once, run each batch of calls concurrently (batches in turn), close it."""
        from ...tool import invoke_tool

        async def main() -> list[list[Any]]:
            await self._start(tool)
            try:
                out = []
                for calls in batches:
                    out.append(list(await asyncio.gather(
                        *(invoke_tool(tool, a, c, timeout=timeout) for a, c in calls))))
                return out
            finally:
                await self._close(tool)

        return _run(main(), self.time_limit * (1 + len(batches)) + 30)

    # -- the definition ----------------------------------------------------------
    def test_definition_is_valid(self) -> None:
        from ...tool import check_tool

        check_tool(self.make_tool())

    def test_spec_is_an_openai_function(self) -> None:
        tool = self.make_tool()
        spec = tool.spec()
        assert spec["type"] == "function", spec
        function = spec["function"]
        assert function["name"] == tool.name and function["description"] == tool.description
        assert function["parameters"].get("type") == "object", "parameters must be a JSON Schema of type object"
        json.dumps(spec)  # what chat templates and OpenAI-style `tools=` receive must be JSON

    def test_no_class_level_mutable_attributes(self) -> None:
        tool = self.make_tool()
        shared = [name for klass in type(tool).__mro__ if klass.__module__ != "builtins"
                  for name, value in vars(klass).items()
                  if not name.startswith("__") and name != "parameters" and isinstance(value, (list, dict, set))]
        assert not shared, (f"{type(tool).__name__} keeps mutable values on the class ({shared}); every instance "
                            "and episode would share them. Build them in __init__, or keep per-episode data in "
                            "context.state")

    # -- calls -------------------------------------------------------------------
    def test_good_calls_succeed(self) -> None:
        if not self.good_arguments:
            pytest.skip("no good_arguments given")
        tool = self.make_tool()
        results = self._calls(tool, [(a, self._context(f"e{i}")) for i, a in enumerate(self.good_arguments)])
        for arguments, result in zip(self.good_arguments, results):
            assert result.ok, f"{short(arguments)} failed: {result.error}: {short(result.content, 200)}"
            assert isinstance(result.content, str)

    def bad_arguments(self) -> list[Any]:
        """Calls that break the schema, derived from it (override to add your own)."""
        schema = self.make_tool().parameters
        properties = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        base = dict(self.good_arguments[0]) if self.good_arguments else {}
        bad: list[Any] = ["{not json", "[1, 2]", 42]
        for name in required:
            bad.append({k: v for k, v in base.items() if k != name})
        for name, prop in properties.items():
            wrong = _wrong_type(prop) if isinstance(prop, dict) else None
            if wrong is not None and isinstance(prop, dict) and "type" in prop:
                bad.append({**base, name: wrong})
        if schema.get("additionalProperties") is False:
            bad.append({**base, "surely_not_an_argument": 1})
        return bad

    def test_bad_arguments_give_error_results(self) -> None:
        tool = self.make_tool()
        bad = self.bad_arguments()
        results = self._calls(tool, [(a, self._context(f"bad{i}")) for i, a in enumerate(bad)])
        for arguments, result in zip(bad, results):
            assert not result.ok, f"the call with {short(arguments)} succeeded: {short(result.content)}"
            assert result.error in ("bad_arguments", "parse_error"), (
                f"{short(arguments)} gave error {result.error!r}; expected bad_arguments or parse_error")
            assert result.content.strip(), "an error result must tell the model what went wrong"

    def test_timeout_is_respected(self) -> None:
        if self.slow_arguments is None:
            pytest.skip("no slow_arguments given")
        import time

        tool = self.make_tool()
        began = time.monotonic()
        [result] = self._calls(tool, [(self.slow_arguments, self._context("slow"))], timeout=self.timeout_probe)
        elapsed = time.monotonic() - began
        assert not result.ok and result.error == "timeout", f"expected a timeout error, got {result}"
        assert elapsed < 10 * self.timeout_probe + 5, f"the timed-out call took {elapsed:.1f} s"

    def test_episodes_share_no_state(self) -> None:
        """The same call gives the same result alone and interleaved with other episodes' calls, and
        copying the tool (as a controller's clone does) carries no episode's state."""
        if not self.good_arguments:
            pytest.skip("no good_arguments given")
        tool = self.make_tool()
        first = self.good_arguments[0]
        others = [(a, self._context(f"other{i}", f"c{i}")) for i, a in enumerate(list(self.good_arguments) * 4)]
        [[alone], mixed_batch] = self._batches(tool, [[(first, self._context("alone"))],
                                                      [*others, (first, self._context("alone-again"))]])
        mixed = mixed_batch[-1]
        assert mixed.ok == alone.ok
        if self.deterministic:
            assert mixed.content == alone.content, (
                f"the same call gave {short(alone.content)} alone but {short(mixed.content)} after other "
                "episodes' calls: state leaks between episodes")
        twin = copy.deepcopy(tool)
        again = self._calls(twin, [(first, self._context("twin"))])[0]
        assert again.ok == alone.ok and (not self.deterministic or again.content == alone.content)
