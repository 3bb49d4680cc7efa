"""The compatibility matrix on the canned (scripted) engine: every client in its default mode, streaming off and on.

Each test runs a real, unmodified client (their versions are the test extra's) against a live server on a
scripted engine: the model adds 2 and 3 with a tool and answers "The answer is 5.", follows a forced tool choice or
a JSON schema, writes code for a code agent. Each records what its session shows (compat_matrix.py): the table in
docs/serve.md is these cells.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from compat_matrix import WRITE, doc_section, load, measure, record, render, write_doc
from serve_helpers import ADD_TOOL, TrackingEngine, serving, smolagents_add_tool, tool_result

CANNED = "canned"
ANSWER = "The answer is 5."


@pytest.fixture(scope="module")
def live():
    with serving(TrackingEngine()) as server:
        yield server


def base_url(live, sid: str) -> str:
    return f"{live.url}/sessions/{sid}/v1"


def check(live, sid, client, mode, stream, *, edits=False):
    """The session's cell, recorded; one agent run never silently splits unless its client rewrites history."""
    session = live.session(sid)
    cell = measure(session)
    assert cell["model turns kept"] == "yes", session.calls
    if not edits:
        assert session.drift_count == 0, session.to_dict()["calls_log"]
    record(client, mode, CANNED, stream, cell)
    return session


# -- openai ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_completions(live, stream):
    sid = live.open_session()
    client = live.client(sid)
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    for _ in range(3):
        if stream:
            chunks = list(client.chat.completions.create(model="scaffold", messages=messages, tools=[ADD_TOOL],
                                                         stream=True))
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
            message = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = [{"id": t.id, "type": "function", "function": {
                    "name": t.function.name, "arguments": t.function.arguments}} for t in calls]
        else:
            reply = client.chat.completions.create(model="scaffold", messages=messages, tools=[ADD_TOOL])
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            break
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": tool_result(c)}
                     for c in message["tool_calls"]]
    assert messages[-1]["content"] == ANSWER
    session = check(live, sid, "openai", "chat completions, tools", stream)
    assert session.counts["calls"] == 2 and len(session.trajectories) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses(live, stream):
    sid = live.open_session()
    client = live.client(sid)
    tool = {"type": "function", "name": "add", "description": "Add two integers.",
            "parameters": ADD_TOOL["function"]["parameters"]}
    items: list = [{"role": "user", "content": "Add 2 and 3."}]
    text = None
    for _ in range(3):
        if stream:
            events = list(client.responses.create(model="scaffold", input=items, tools=[tool], stream=True))
            assert events[0].type == "response.created" and events[-1].type == "response.completed"
            response = events[-1].response
        else:
            response = client.responses.create(model="scaffold", input=items, tools=[tool])
        items += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            text = response.output_text
            break
        items += [{"type": "function_call_output", "call_id": c.call_id,
                   "output": str(sum(json.loads(c.arguments).values()))} for c in calls]
    assert text == ANSWER
    check(live, sid, "openai", "responses, tools", stream)


def test_openai_responses_previous_response_id(live):
    """A conversation continued by id (the server stored the first response) stays one trajectory."""
    sid = live.open_session()
    client = live.client(sid)
    tool = {"type": "function", "name": "add", "parameters": ADD_TOOL["function"]["parameters"]}
    first = client.responses.create(model="scaffold", input="Add 2 and 3.", tools=[tool])
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(model="scaffold", previous_response_id=first.id, tools=[tool], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"}])
    assert second.output_text == ANSWER
    session = check(live, sid, "openai", "responses, previous_response_id", False)
    assert len(session.trajectories) == 1 and session.counts["extend"] == 1


# -- the OpenAI Agents SDK --------------------------------------------------------------------------------


def agents_sdk():
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return agents, add


def run_agent(agent, question, stream):
    agents = pytest.importorskip("agents")

    async def go():
        if not stream:
            return await agents.Runner.run(agent, question, max_turns=6)
        result = agents.Runner.run_streamed(agent, question, max_turns=6)
        async for _ in result.stream_events():
            pass
        return result

    return asyncio.run(go())


def sdk_model(live, sid, mode):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url(live, sid), api_key="none", max_retries=0)
    if mode == "chat":
        return agents.OpenAIChatCompletionsModel(model="scaffold", openai_client=client)
    return agents.OpenAIResponsesModel(model="scaffold", openai_client=client)


@pytest.mark.parametrize("stream", [False, True])
def test_agents_sdk_default_mode(live, stream):
    """The SDK's default model (the Responses API), given only a base URL: set_default_openai_client."""
    agents, add = agents_sdk()
    from openai import AsyncOpenAI

    sid = live.open_session()
    agents.set_default_openai_client(AsyncOpenAI(base_url=base_url(live, sid), api_key="none", max_retries=0),
                                     use_for_tracing=False)
    result = run_agent(agents.Agent(name="adder", tools=[add], model="scaffold"), "Add 2 and 3.", stream)
    assert result.final_output == ANSWER
    check(live, sid, "openai-agents", "default (responses), tools", stream)


@pytest.mark.parametrize("stream", [False, True])
def test_agents_sdk_chat_completions_mode(live, stream):
    agents, add = agents_sdk()
    sid = live.open_session()
    agent = agents.Agent(name="adder", tools=[add], model=sdk_model(live, sid, "chat"))
    assert run_agent(agent, "Add 2 and 3.", stream).final_output == ANSWER
    check(live, sid, "openai-agents", "chat completions, tools", stream)


def test_agents_sdk_typed_output(live):
    """output_type: the SDK asks for a JSON schema (text.format); the grammar holds the model to it."""
    agents, add = agents_sdk()
    from pydantic import BaseModel

    class Answer(BaseModel):
        value: int

    sid = live.open_session()
    agent = agents.Agent(name="typed", output_type=Answer, model=sdk_model(live, sid, "responses"))
    assert run_agent(agent, "What is 2 plus 3?", False).final_output == Answer(value=5)
    session = check(live, sid, "openai-agents", "default (responses), typed output", False)
    assert session.calls[0]["choices"][0]["message"]["content"] == '{"value": 5}'


def test_agents_sdk_sub_agents(live):
    """An agent with another agent as a tool: each keeps its own conversation in the one session."""
    agents, add = agents_sdk()
    sid = live.open_session()
    model = sdk_model(live, sid, "responses")
    adder = agents.Agent(name="adder", instructions="You add numbers.", tools=[add], model=model)
    boss = agents.Agent(name="boss", tools=[adder.as_tool(tool_name="adder_agent", tool_description="Adds.")],
                        model=model)
    assert run_agent(boss, "Add 2 and 3.", False).final_output == ANSWER
    session = check(live, sid, "openai-agents", "default (responses), agent as tool", False)
    assert len(session.trajectories) == 2 and session.counts["calls"] == 4


def test_agents_sdk_concurrent_agents_in_one_session(live):
    """Three agents (different instructions) run at once in one session, as parallel branches or sub-agents do: each
    keeps its own conversation, none corrupts another."""
    agents, add = agents_sdk()
    sid = live.open_session()
    model = sdk_model(live, sid, "responses")
    team = [agents.Agent(name=f"adder{i}", instructions=f"You are adder number {i}.", tools=[add], model=model)
            for i in range(3)]

    async def together():
        return await asyncio.gather(*(agents.Runner.run(a, "Add 2 and 3.", max_turns=4) for a in team))

    assert [r.final_output for r in asyncio.run(together())] == [ANSWER] * 3
    session = check(live, sid, "openai-agents", "default (responses), 3 concurrent agents", False)
    assert len(session.trajectories) == 3 and session.counts["calls"] == 6
    for i, traj in enumerate(sorted(session.trajectories, key=lambda t: t.start.text)):
        assert f"adder number {i}" in traj.start.text and traj.turns == 2


# -- LangGraph, smolagents, pydantic-ai, litellm, anthropic -------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_langgraph_prebuilt_react_agent(live, stream):
    pytest.importorskip("langgraph")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    sid = live.open_session()
    llm = ChatOpenAI(model="scaffold", base_url=base_url(live, sid), api_key="none", max_retries=0, streaming=stream)
    state = create_react_agent(llm, [add]).invoke({"messages": [("user", "Add 2 and 3.")]})
    assert state["messages"][-1].content == ANSWER
    check(live, sid, "langgraph", "prebuilt ReAct agent", stream)


def smol_model(live, sid):
    smolagents = pytest.importorskip("smolagents")
    return smolagents.OpenAIServerModel(model_id="scaffold", api_base=base_url(live, sid), api_key="none")


def test_smolagents_tool_calling_agent(live):
    """Defaults: tool_choice=required on every call (grammar-constrained), history resent as rewritten text."""
    smolagents = pytest.importorskip("smolagents")
    sid = live.open_session()
    agent = smolagents.ToolCallingAgent(tools=[smolagents_add_tool()], model=smol_model(live, sid), verbosity_level=0)
    assert agent.run("Add 2 and 3.") == ANSWER
    session = check(live, sid, "smolagents", "ToolCallingAgent (defaults)", False, edits=True)
    assert session.counts["calls"] == 2


def test_smolagents_code_agent(live):
    smolagents = pytest.importorskip("smolagents")
    sid = live.open_session()
    agent = smolagents.CodeAgent(tools=[smolagents_add_tool()], model=smol_model(live, sid), verbosity_level=0)
    assert agent.run("Add 2 and 3.") == ANSWER
    check(live, sid, "smolagents", "CodeAgent (defaults)", False)


def pydantic_agent(live, sid, **options):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("scaffold", provider=OpenAIProvider(base_url=base_url(live, sid), api_key="none"))
    agent = pydantic_ai.Agent(model, **options)

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return agent


@pytest.mark.parametrize("stream", [False, True])
def test_pydantic_ai_text_output(live, stream):
    sid = live.open_session()
    agent = pydantic_agent(live, sid)

    async def go():
        if not stream:
            return (await agent.run("Add 2 and 3.")).output
        async with agent.run_stream_events("Add 2 and 3.") as stream_:  # every model request streamed
            events = [event async for event in stream_]
        return events[-1].result.output

    assert asyncio.run(go()) == ANSWER
    check(live, sid, "pydantic-ai", "text output, tools", stream)


def test_pydantic_ai_typed_output(live):
    """A typed output_type: pydantic-ai forces its final_result tool (tool_choice=required)."""
    from pydantic import BaseModel

    class Answer(BaseModel):
        value: int

    sid = live.open_session()
    agent = pydantic_agent(live, sid, output_type=Answer)
    assert agent.run_sync("Add 2 and 3.").output == Answer(value=5)
    check(live, sid, "pydantic-ai", "typed output (forced tool)", False)


@pytest.mark.parametrize("stream", [False, True])
def test_litellm(live, stream):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list
    litellm = pytest.importorskip("litellm")
    sid = live.open_session()
    messages: list = [{"role": "user", "content": "Add 2 and 3."}]
    options = {"model": "openai/scaffold", "api_base": base_url(live, sid), "api_key": "none", "tools": [ADD_TOOL]}
    for _ in range(3):
        if stream:
            chunks = list(litellm.completion(messages=messages, stream=True, **options))
            message = litellm.stream_chunk_builder(chunks, messages=messages).choices[0].message
        else:
            message = litellm.completion(messages=messages, **options).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        messages += [{"role": "tool", "tool_call_id": c.id, "content": tool_result(c)} for c in message.tool_calls]
    assert messages[-1]["content"] == ANSWER
    check(live, sid, "litellm", "completion, tools", stream)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages(live, stream):
    anthropic = pytest.importorskip("anthropic")
    sid = live.open_session()
    client = anthropic.Anthropic(base_url=f"{live.url}/sessions/{sid}", api_key="none", max_retries=0)
    tool = {"name": "add", "description": "Add two integers.", "input_schema": ADD_TOOL["function"]["parameters"]}
    messages: list = [{"role": "user", "content": "Add 2 and 3."}]
    for _ in range(3):
        if stream:
            with client.messages.stream(model="scaffold", max_tokens=128, messages=messages, tools=[tool]) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(model="scaffold", max_tokens=128, messages=messages, tools=[tool])
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            break
        assert reply.stop_reason == "tool_use"
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id,
                                                      "content": str(b.input["a"] + b.input["b"])} for b in uses]})
    assert reply.content[0].text == ANSWER and reply.stop_reason == "end_turn"
    check(live, sid, "anthropic", "messages, tools", stream)


# -- the table --------------------------------------------------------------------------------------------


def test_the_docs_show_the_matrix():
    """docs/serve.md's table is the rendering of the measured cells (rewritten with SCAFFOLD_WRITE_MATRIX=1)."""
    if WRITE:
        write_doc()
    assert doc_section() == render(load()), "docs/serve.md's compatibility matrix is stale: run the matrix tests " \
                                            "with SCAFFOLD_WRITE_MATRIX=1"
