"""Conformance tests for tools: a valid definition, calls that succeed, fail as results, time out, and share
neither state nor the event loop."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from ._common import ComponentConformance, call_with_deadline, least_block, short

#: Arguments a model writes that no tool may raise on: unparsable text, a non-object, an unknown key.
BAD_ARGUMENTS: tuple[Any, ...] = ("{not json", "[1, 2]", 42, {"__scaffold_unknown_argument__": 1})


def _wrong_type(schema: dict[str, Any]) -> Any:
    """A JSON value that does not match ``schema``'s ``type`` (None when every candidate would)."""
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer"}
    for candidate in ({"unexpected": "object"}, ["a", "list"], "a string", 12345, True):
        name = names[type(candidate)]
        if not (name in kinds or (name == "integer" and "number" in kinds)):
            return candidate
    return None


class ToolConformance(ComponentConformance):
    """Subclass this in your plugin's tests to check a tool against the tool contract
    (:mod:`scaffold_core.tool`).

    Set ``name``/``plugin`` (or override :meth:`make_tool`) and give example ``calls`` (argument
    dicts a model might send, each a valid call)::

        class TestMyTool(ToolConformance):
            plugin = scaffold_mytools
            name = "lookup"
            calls = [{"key": "alpha"}, {"key": "beta"}]

    Calls go through :func:`~scaffold_core.tool.invoke_tool`, as agent controllers make them, on a
    started tool (``start()``/``close()`` around each test).
    """

    kind: ClassVar[str] = "tool"
    #: Valid argument dicts; each call must succeed (``ok``).
    calls: ClassVar[Sequence[dict[str, Any]]] = ()
    #: Seconds one test's calls may take together.
    time_limit: ClassVar[float] = 60.0
    #: Whether the same arguments give the same content (then concurrent calls must agree with serial ones).
    deterministic: ClassVar[bool] = True
    #: Arguments of a valid call that takes longer than ``timeout_probe`` seconds (optional): such a call
    #: must come back as a ``timeout`` error promptly.
    slow_arguments: ClassVar[dict[str, Any] | None] = None
    #: The timeout the slow call is made with.
    timeout_probe: ClassVar[float] = 0.5

    def make_tool(self) -> Any:
        """The tool under test (default: built by ``name`` through the registry)."""
        return self.build()

    def with_tool(self, body: Callable[[Any], Any], tool: Any = None) -> Any:
        """Start the tool, ``await body(tool)``, close it; bounded by ``time_limit``."""
        tool = tool if tool is not None else self.make_tool()

        async def main() -> Any:
            await tool.start()
            try:
                return await body(tool)
            finally:
                await tool.close()

        return call_with_deadline(lambda: asyncio.run(main()), self.time_limit, "tool calls")

    @staticmethod
    async def invoke(tool: Any, arguments: Any, n: int = 0, *, timeout: float | None = None) -> Any:
        from scaffold_core.tool import ToolContext, invoke_tool

        return await invoke_tool(tool, arguments, ToolContext(episode_id=f"conformance-{n}", call_id=f"call-{n}"),
                                 timeout=timeout)

    def schema_breaking_arguments(self) -> list[dict[str, Any]]:
        """Calls that break the tool's own schema: a required argument missing, one of the wrong type,
        an extra one where the schema forbids extras (derived from ``parameters`` and the first call)."""
        schema = self.make_tool().parameters
        base = dict(self.calls[0]) if self.calls else {}
        bad = [{k: v for k, v in base.items() if k != name} for name in schema.get("required") or []]
        for name, prop in (schema.get("properties") or {}).items():
            wrong = _wrong_type(prop) if isinstance(prop, dict) and "type" in prop else None
            if wrong is not None:
                bad.append({**base, name: wrong})
        if schema.get("additionalProperties") is False:
            bad.append({**base, "__scaffold_unknown_argument__": 1})
        return bad

    # -- tests -----------------------------------------------------------
    def test_definition_is_valid(self) -> None:
        """``name``, ``description``, ``parameters`` (a JSON Schema object), ``timeout`` and ``async call``."""
        from scaffold_core.tool import check_tool

        check_tool(self.make_tool())

    def test_example_calls_succeed(self) -> None:
        """Every example call returns an ``ok`` :class:`~scaffold_core.tool.ToolResult` with text content."""
        assert self.calls, "set `calls` to argument dicts a model might send (each a valid call)"

        async def body(tool: Any) -> list[Any]:
            return [await self.invoke(tool, args, i) for i, args in enumerate(self.calls)]

        for args, result in zip(self.calls, self.with_tool(body)):
            assert result.ok, f"call {short(args)} failed: {result.error}: {short(result.content, 200)}"
            assert isinstance(result.content, str)

    def test_bad_arguments_give_error_results(self) -> None:
        """Unparsable, non-object or unknown arguments give a failed result (never an exception)."""
        async def body(tool: Any) -> list[Any]:
            return [await self.invoke(tool, args, i) for i, args in enumerate(BAD_ARGUMENTS)]

        for args, result in zip(BAD_ARGUMENTS, self.with_tool(body)):
            if result.ok and isinstance(args, dict):
                continue  # a schema that allows extra keys may accept them
            assert not result.ok and result.error in ("parse_error", "bad_arguments", "failed"), (
                f"arguments {short(args)} gave {result}")

    def test_schema_breaking_arguments_give_error_results(self) -> None:
        """Arguments that break the tool's schema come back as ``bad_arguments`` results with a message."""
        bad = self.schema_breaking_arguments()

        async def body(tool: Any) -> list[Any]:
            return [await self.invoke(tool, args, i) for i, args in enumerate(bad)]

        for args, result in zip(bad, self.with_tool(body)):
            assert not result.ok and result.error == "bad_arguments", (
                f"arguments {short(args)} break the tool's schema but gave {result}")
            assert result.content.strip(), "an error result must tell the model what went wrong"

    def test_spec_is_an_openai_function(self) -> None:
        """``spec()`` is what chat templates and OpenAI-style ``tools=`` take: JSON, an object schema."""
        tool = self.make_tool()
        spec = tool.spec()
        assert spec["type"] == "function", spec
        function = spec["function"]
        assert function["name"] == tool.name and function["description"] == tool.description
        assert function["parameters"].get("type") == "object", "parameters must be a JSON Schema of type object"
        json.dumps(spec)

    def test_timeout_is_respected(self) -> None:
        """A call outlasting its timeout comes back as a ``timeout`` error, promptly."""
        if self.slow_arguments is None:
            return
        slow = self.slow_arguments

        async def body(tool: Any) -> tuple[Any, float]:
            began = time.monotonic()
            result = await self.invoke(tool, slow, timeout=self.timeout_probe)
            return result, time.monotonic() - began

        result, elapsed = self.with_tool(body)
        assert not result.ok and result.error == "timeout", f"expected a timeout error, got {result}"
        assert elapsed < 10 * self.timeout_probe + 5, f"the timed-out call took {elapsed:.1f} s"

    def test_a_copied_tool_answers_as_the_original(self) -> None:
        """Copying the tool (as a controller's per-episode clone may) carries no episode's state into it."""
        if not self.deterministic or not self.calls:
            return
        first = self.calls[0]

        async def body(tool: Any) -> Any:
            return await self.invoke(tool, first)

        original = self.make_tool()
        alone = self.with_tool(body, original)
        again = self.with_tool(body, copy.deepcopy(original))
        assert (again.ok, again.content) == (alone.ok, alone.content), (
            "a deep copy of the tool answers differently from the original: state leaks between episodes")

    def test_concurrent_calls_agree_with_serial_ones(self) -> None:
        """The example calls made all at once (one tool serves every episode) return what they return
        one at a time: no per-call state on ``self``."""
        if not self.deterministic or not self.calls:
            return

        async def body(tool: Any) -> tuple[list[Any], list[Any]]:
            serial = [await self.invoke(tool, args, i) for i, args in enumerate(self.calls)]
            together = await asyncio.gather(*(self.invoke(tool, args, 100 + i)
                                              for i, args in enumerate([*self.calls] * 3)))
            return serial, list(together)

        serial, together = self.with_tool(body)
        expected = [(r.ok, r.content) for r in serial] * 3
        assert [(r.ok, r.content) for r in together] == expected, (
            "results differ when calls run concurrently: state leaks between episodes")

    def test_does_not_block_the_event_loop(self) -> None:
        """No call holds the event loop for more than ``max_loop_block`` seconds (every episode shares it)."""
        from ..live import LoopLagMonitor

        async def body(tool: Any) -> float:
            async with LoopLagMonitor() as lag:
                for i, args in enumerate([*self.calls, *BAD_ARGUMENTS]):
                    await self.invoke(tool, args, i)
            return lag.max_block

        blocked = least_block(lambda: self.with_tool(body), self.max_loop_block)
        assert blocked <= self.max_loop_block, (
            f"a call held the event loop for {blocked:.3f} s (bound: max_loop_block = {self.max_loop_block:g} s): "
            "run CPU-heavy work in a thread (asyncio.to_thread) or a subprocess, and await I/O")

    def test_calls_leave_class_state_unchanged(self) -> None:
        """Calls change no class-level container of the tool's classes (``parameters`` included)."""
        tool = self.make_tool()

        async def body(t: Any) -> None:
            for i, args in enumerate(self.calls):
                await self.invoke(t, args, i)

        self.assert_class_state_unchanged(tool, lambda: self.with_tool(body, tool), "calls")
