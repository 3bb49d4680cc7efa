"""Conformance tests for tools: a valid definition, calls that succeed, fail as results, and share the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from ._common import ComponentConformance, call_with_deadline, least_block, short

#: Arguments a model writes that no tool may raise on: unparsable text, a non-object, an unknown key.
BAD_ARGUMENTS: tuple[Any, ...] = ("{not json", "[1, 2]", 42, {"__scaffold_unknown_argument__": 1})


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
    async def invoke(tool: Any, arguments: Any, n: int = 0) -> Any:
        from ...tool import ToolContext, invoke_tool

        return await invoke_tool(tool, arguments, ToolContext(episode_id=f"conformance-{n}", call_id=f"call-{n}"))

    # -- tests -----------------------------------------------------------
    def test_definition_is_valid(self) -> None:
        """``name``, ``description``, ``parameters`` (a JSON Schema object), ``timeout`` and ``async call``."""
        from ...tool import check_tool

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
        assert [(r.ok, r.content) for r in together] == expected, "results differ when calls run concurrently"

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
