"""The tool contract (scaffold_core.tool): invoke_tool never raises, validates, bounds time; check_tool and specs."""

from __future__ import annotations

import asyncio
import copy
import time

import pytest

from scaffold_core.errors import ScaffoldError
from scaffold_core.tool import (
    ERROR_KINDS,
    Tool,
    ToolCallError,
    ToolContext,
    ToolDefinitionError,
    ToolResult,
    check_tool,
    invoke_tool,
    tool_specs,
    unknown_tool,
)


def ctx(**kw) -> ToolContext:
    return ToolContext(episode_id="ep-1", call_id="call-1", **kw)


class Adder(Tool):
    name = "add"
    description = "Add two integers."
    parameters = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }

    def __init__(self):
        self.calls = 0

    async def call(self, arguments, context):
        self.calls += 1
        return ToolResult(str(arguments["a"] + arguments["b"]))


class Sleeper(Tool):
    name = "sleeper"
    description = "Sleeps."
    timeout = 0.2

    def __init__(self):
        self.cancelled = False

    async def call(self, arguments, context):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return ToolResult("woke up")


class Raiser(Tool):
    name = "raiser"
    description = "Raises what it is told to."

    def __init__(self, exc):
        self.exc = exc

    async def call(self, arguments, context):
        raise self.exc


class Returner(Tool):
    name = "returner"
    description = "Returns a fixed value."

    def __init__(self, value):
        self.value = value

    async def call(self, arguments, context):
        return self.value


def run(coro):
    return asyncio.run(coro)


# -- invoke_tool -----------------------------------------------------------------------------


def test_valid_arguments_reach_the_tool_and_the_result_comes_back():
    tool = Adder()
    result = run(invoke_tool(tool, {"a": 2, "b": 3}, ctx()))
    assert result.ok and result.error is None and result.content == "5"
    assert tool.calls == 1
    assert result.metadata["duration_s"] >= 0


def test_arguments_as_json_text_are_parsed():
    result = run(invoke_tool(Adder(), '{"a": 40, "b": 2}', ctx()))
    assert result.ok and result.content == "42"


@pytest.mark.parametrize("arguments, fragment", [
    ({"a": 1}, "'b' is a required property"),
    ({"a": 1, "b": "two"}, "b: 'two' is not of type 'integer'"),
    ({"a": 1, "b": 2, "c": 3}, "Additional properties are not allowed ('c' was unexpected)"),
    ("[1, 2]", "must be a JSON object, got list"),
])
def test_bad_arguments_give_an_error_result_and_the_tool_is_not_called(arguments, fragment):
    tool = Adder()
    result = run(invoke_tool(tool, arguments, ctx()))
    assert not result.ok and result.error == "bad_arguments"
    assert fragment in result.content
    assert tool.calls == 0


def test_bad_arguments_message_names_the_tool_and_the_expected_arguments():
    result = run(invoke_tool(Adder(), {}, ctx()))
    assert "tool 'add'" in result.content
    assert '"a": integer (required)' in result.content and '"b": integer (required)' in result.content


def test_unparseable_arguments_give_a_parse_error():
    tool = Adder()
    result = run(invoke_tool(tool, '{"a": 1, "b": ', ctx()))
    assert not result.ok and result.error == "parse_error"
    assert "not valid JSON" in result.content and tool.calls == 0


NESTED = '{"a": ' * 2000 + "1" + "}" * 2000  # about 12 KB: past the parser's recursion limit


@pytest.mark.parametrize("arguments, says", [
    (NESTED, "the arguments are nested too deeply to read"),
    ('{"a": ' + "5" * 5000 + ', "b": 1}', "hold an integer of more than"),
    ("[" * 100_000, "nested too deeply"),
])
def test_arguments_that_break_the_json_reader_are_parse_errors(arguments, says):
    """RecursionError (deep nesting) and ValueError (a 5000-digit integer) are read errors the model reads."""
    tool = Adder()
    result = run(invoke_tool(tool, arguments, ctx()))
    assert result.error == "parse_error" and says in result.content and tool.calls == 0, result.content
    assert len(result.content) < 600


def test_a_huge_bad_argument_is_not_echoed_whole():
    huge = "x" * 10_000_000
    for arguments in ({"a": 1, "b": huge}, {"a": huge, "b": huge, "c": huge, "d": huge}, [huge]):
        result = run(invoke_tool(Adder(), arguments, ctx()))
        assert result.error == "bad_arguments" and len(result.content) < 2000, len(result.content)
        assert "more characters]" in result.content or "..." in result.content
    unknown = unknown_tool(huge, ["add"])
    assert unknown.error == "unknown_tool" and len(unknown.content) < 400


def test_deeply_nested_argument_values_are_bad_arguments_not_crashes():
    deep: object = 1
    for _ in range(5000):
        deep = {"a": deep}
    result = run(invoke_tool(Adder(), {"a": deep, "b": 1}, ctx()))
    assert result.error == "bad_arguments" and len(result.content) < 2000, result.content


def test_a_tool_failing_with_a_huge_message_is_reported_bounded():
    result = run(invoke_tool(Raiser(RuntimeError("y" * 10_000_000)), {}, ctx()))
    assert result.error == "failed" and "more characters]" in result.content and len(result.content) < 1200


def test_timeout_is_respected_and_cancels_the_call():
    tool = Sleeper()
    start = time.monotonic()
    result = run(invoke_tool(tool, {}, ctx()))
    elapsed = time.monotonic() - start
    assert not result.ok and result.error == "timeout"
    assert "timed out after 0.2 s" in result.content
    assert elapsed < 5
    assert tool.cancelled


def test_explicit_timeout_overrides_the_tools():
    tool = Sleeper()
    tool.timeout = 60
    result = run(invoke_tool(tool, {}, ctx(), timeout=0.1))
    assert result.error == "timeout" and "0.1 s" in result.content and tool.cancelled


@pytest.mark.parametrize("exc, kind, fragment", [
    (RuntimeError("disk on fire"), "failed", "tool 'raiser' failed: RuntimeError: disk on fire"),
    (KeyError("x"), "failed", "KeyError"),
    (ToolCallError("no such page", kind="bad_arguments"), "bad_arguments", "no such page"),
    (ToolCallError("quota used up", kind="limit"), "limit", "quota used up"),
])
def test_exceptions_become_error_results(exc, kind, fragment):
    result = run(invoke_tool(Raiser(exc), {}, ctx()))
    assert not result.ok and result.error == kind and fragment in result.content


def test_cancellation_of_the_caller_propagates():
    async def main():
        task = asyncio.create_task(invoke_tool(Sleeper(), {}, ctx(), timeout=30))
        await asyncio.sleep(0.05)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        run(main())


def test_a_str_return_is_a_success_and_other_types_are_failures():
    text = run(invoke_tool(Returner("plain text"), {}, ctx()))
    assert text.ok and text.error is None and text.content == "plain text"
    bad = run(invoke_tool(Returner(42), {}, ctx()))
    assert bad.error == "failed" and "returned int, expected a ToolResult or str" in bad.content


def test_an_invalid_schema_is_a_failed_result_not_an_exception():
    tool = Returner("x")
    tool.parameters = {"type": "object", "properties": {"x": {"type": "no-such-type"}}}
    result = run(invoke_tool(tool, {}, ctx()))
    assert result.error == "failed" and "invalid parameters schema" in result.content


def test_context_state_is_what_the_tool_sees():
    class Counter(Tool):
        name = "counter"
        description = "Counts calls per episode."

        async def call(self, arguments, context):
            context.state["n"] = context.state.get("n", 0) + 1
            return ToolResult(str(context.state["n"]))

    tool = Counter()
    first, second = ctx(), ctx()
    assert [run(invoke_tool(tool, {}, first)).content for _ in range(3)] == ["1", "2", "3"]
    assert run(invoke_tool(tool, {}, second)).content == "1"


# -- results, helpers ------------------------------------------------------------------------


def test_tool_result_checks_its_error_kind():
    assert ToolResult("x", ok=False).error == "failed"
    assert ToolResult.failure("limit", "too much", used=3).metadata == {"used": 3}
    with pytest.raises(ValueError, match="not one of"):
        ToolResult("x", ok=False, error="oops")
    with pytest.raises(ValueError, match="ok=True but error"):
        ToolResult("x", error="failed")
    with pytest.raises(TypeError, match="content must be a str"):
        ToolResult(3)
    with pytest.raises(ValueError):
        ToolCallError("x", kind="oops")
    assert set(ERROR_KINDS) == {"bad_arguments", "timeout", "failed", "unknown_tool", "parse_error", "limit"}
    assert ToolResult("hi").to_dict() == {"content": "hi", "ok": True, "error": None, "metadata": {}}


def test_unknown_tool_suggests_the_closest_name():
    result = unknown_tool("calculater", ["calculator", "python", "search"])
    assert not result.ok and result.error == "unknown_tool"
    assert "Did you mean 'calculator'?" in result.content and "python" in result.content


def test_copying_a_tool_returns_the_same_tool():
    tool = Adder()
    holder = {"tools": [tool], "other": [1]}
    clone = copy.deepcopy(holder)
    assert clone["tools"][0] is tool and clone["other"] is not holder["other"]
    assert copy.copy(tool) is tool


# -- check_tool and spec ---------------------------------------------------------------------


def test_spec_is_the_openai_function_shape_and_a_copy():
    tool = Adder()
    spec = tool.spec()
    assert spec == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.", "parameters": Adder.parameters}}
    spec["function"]["parameters"]["properties"]["a"]["type"] = "string"
    assert Adder.parameters["properties"]["a"]["type"] == "integer"
    assert tool_specs([tool, Sleeper()])[1]["function"]["name"] == "sleeper"


def test_check_tool_accepts_a_good_tool():
    check_tool(Adder())


def make(**attrs):
    return type("Broken", (Adder,), attrs)()


@pytest.mark.parametrize("attrs, fragment", [
    ({"name": ""}, "name '' is not valid"),
    ({"name": "has space"}, "name 'has space' is not valid"),
    ({"description": "  "}, "description is missing"),
    ({"parameters": None}, "parameters must be a JSON Schema dict"),
    ({"parameters": {"type": "string"}}, 'set "type": "object"'),
    ({"parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}},
     "not a valid JSON Schema"),
    ({"parameters": {"type": "object", "required": "x"}}, "not a valid JSON Schema"),
    ({"timeout": 0}, "timeout 0 must be a positive number"),
    ({"timeout": "10"}, "timeout '10' must be a positive number"),
    ({"call": lambda self, arguments, context: ToolResult("x")}, "async def call"),
])
def test_check_tool_names_the_tool_and_the_fix(attrs, fragment):
    with pytest.raises(ToolDefinitionError, match="Broken") as info:
        check_tool(make(**attrs))
    assert fragment in str(info.value)
    assert isinstance(info.value, ScaffoldError)


def test_check_tool_rejects_a_tool_that_does_not_implement_call():
    class Lazy(Tool):
        name = "lazy"
        description = "Does nothing."

    with pytest.raises(ToolDefinitionError, match="call is not implemented"):
        check_tool(Lazy())
