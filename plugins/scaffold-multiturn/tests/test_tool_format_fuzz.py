"""Hostile model output against each built-in tool-call format: parse() never raises, every call it returns
gets a result without raising, and no error text repeats more than about 1 KB of what the model wrote.
Property-based (hypothesis): random text, tool-call-shaped text with random JSON, deep nesting, huge
integers, huge strings, tags left open or doubled."""

from __future__ import annotations

import asyncio
import json

import pytest
from agent_helpers import AddTool, NotesTool, call, turn_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_agent import one

from scaffold_core.tool import ToolContext, ToolResult
from scaffold_core.tool_format import ToolCall, ToolFormat, run_tool_call
from scaffold_multiturn.agent import AgentController
from scaffold_multiturn.tool_formats import HermesFormat, NativeFormat

FORMATS = {"hermes": HermesFormat(), "native": NativeFormat()}
TOOLS = {"add": AddTool(), "notes": NotesTool()}
#: An error text may hold the fixed wording, the expected arguments and up to ~1 KB of the model's input.
MAX_ERROR_CHARS = 2000

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)
call_objects = st.fixed_dictionaries(
    {}, optional={"name": st.sampled_from(["add", "notes", "nope", ""]) | st.text(max_size=20) | json_values,
                  "arguments": json_values | st.text(max_size=40) | st.fixed_dictionaries(
                      {"a": json_values, "b": json_values}),
                  "id": json_values})
bodies = st.one_of(
    call_objects.map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=200),
    st.integers(1, 20_000).map(lambda n: "[" * n),                      # RecursionError in the JSON reader
    st.integers(1, 5_000).map(lambda n: '{"name": "add", "arguments": ' * n),
    st.integers(4_300, 6_000).map(lambda n: '{"name": "add", "arguments": {"a": ' + "7" * n + ', "b": 1}}'),
    st.integers(100_000, 300_000).map(lambda n: '{"name": "add", "arguments": {"a": "' + "x" * n + '", "b": 1}}'),
    st.integers(100_000, 300_000).map(lambda n: '{"name": "' + "n" * n + '", "arguments": {}}'),
)
pieces = st.one_of(bodies.map(lambda b: f"<tool_call>{b}</tool_call>"), bodies.map(lambda b: f"<tool_call>\n{b}"),
                   st.sampled_from(["<tool_call>", "</tool_call>", "<tool_call></tool_call>", "```json\n", "```"]),
                   st.text(max_size=50))
replies = st.lists(pieces, max_size=5).map("".join)


def results_of(calls: list[ToolCall]) -> list[ToolResult]:
    async def main():
        return [await run_tool_call(c, TOOLS, ToolContext("ep", c.id or "c")) for c in calls]

    return asyncio.run(main())


@pytest.mark.parametrize("name", sorted(FORMATS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(reply=replies)
def test_parse_never_raises_and_every_call_gets_a_bounded_result(name, reply):
    fmt: ToolFormat = FORMATS[name]
    calls = fmt.parse(reply)
    assert isinstance(calls, list) and all(isinstance(c, ToolCall) for c in calls)
    results = results_of(calls)
    assert len(results) == len(calls)
    for c, result in zip(calls, results):
        assert isinstance(result, ToolResult)
        if c.error is not None:
            assert result.error == "parse_error"
        if not result.ok:
            assert len(result.content) <= MAX_ERROR_CHARS, (result.error, result.content[:300])
    messages = fmt.result_messages(calls, results) if calls else []
    assert all(isinstance(m["content"], str) for m in messages)


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("body, kind, says", [
    ("[" * 4096, "parse_error", "nested too deeply"),                                  # a 4 KB nested JSON
    ('{"name": "add", "arguments": {"a": ' + "9" * 5000 + ', "b": 1}}', "parse_error", "an integer of more than"),
    ('{"name": "add", "arguments": "{\\"a\\": ' + "9" * 5000 + '}"}', "parse_error", "an integer of more than"),
    ('{"name": "add", "arguments": {"a": "' + "x" * 10_000_000 + '", "b": 1}}', "bad_arguments", "more characters]"),
])
def test_the_reported_attacks_are_parse_or_argument_errors(name, body, kind, says):
    [parsed] = FORMATS[name].parse(f"<tool_call>{body}</tool_call>")
    [result] = results_of([parsed])
    assert result.error == kind and says in result.content, result.content[:500]
    assert len(result.content) <= MAX_ERROR_CHARS


def test_hostile_calls_never_fail_the_episode():
    """Each hostile call is answered with an error the model reads; the episode goes on and ends normally."""
    hostile = ["<tool_call>" + "[" * 4096 + "</tool_call>",
               '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 5000 + ', "b": 1}}</tool_call>',
               '<tool_call>{"name": "add", "arguments": {"a": "' + "x" * 50_000 + '", "b": 1}}</tool_call>']

    def respond(prompt, request):
        turn = turn_of(prompt)
        return hostile[turn] if turn < len(hostile) else call("add", a=2, b=3) if turn == 3 else "#### 5"

    result, _ = one(respond, max_turns=6, max_tokens=100_000)
    assert result.ok, result.error
    logged = result.samples[0].metadata["tool_calls"]
    assert [c["error"] for c in logged] == ["parse_error", "parse_error", "bad_arguments", None]
    assert result.metrics["tool_error_parse_error"] == 2.0 and result.samples[0].metadata["end"] == "answer"
    json.dumps(result.samples[0].metadata)  # the log is writable


def test_a_format_whose_parse_raises_gives_the_model_a_parse_error(caplog):
    class Fragile(HermesFormat):
        name = "fragile"

        def parse(self, text):
            if "boom" in text:
                raise RecursionError("maximum recursion depth exceeded")
            return super().parse(text)

    def respond(prompt, request):
        return "boom" if turn_of(prompt) == 0 else "#### 5"

    result, _ = one(respond, AgentController(tools=[AddTool()], format=Fragile()))
    assert result.ok, result.error
    [logged] = result.samples[0].metadata["tool_calls"]
    assert logged["error"] == "parse_error"
    reply = result.samples[0].metadata["messages"][1]["content"]
    assert "could not be read (RecursionError" in reply
    assert "raised RecursionError in parse()" in caplog.text
