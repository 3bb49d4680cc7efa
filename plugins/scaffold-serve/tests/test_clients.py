"""Agent frameworks as they are, against the endpoint on a scripted engine: the OpenAI Agents SDK with a function
tool and LangChain's ChatOpenAI with bound tools. Each runs a tool conversation; the session holds it as one
trajectory (drift 0) with every tool turn in it."""

from __future__ import annotations

import asyncio

import pytest
from serve_helpers import LiveServer, TrackingEngine


@pytest.fixture(scope="module")
def live():
    server = LiveServer(TrackingEngine())
    try:
        yield server
    finally:
        server.close()


def assert_one_tool_conversation(live, sid):
    session = live.session(sid)
    assert session.counts["calls"] == 2 and session.drift_count == 0, session.summary()
    assert len(session.trajectories) == 1 and session.counts["extend"] == 1
    traj = session.trajectories[0]
    turns = [t.text for t in traj.conv.turns]
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in turns[0]
    assert turns[1] == "The answer is 5."
    text = live.engine.tokenizer.decode(traj.ids())
    assert "<tool_response>\n5\n</tool_response>" in text  # the tool turn is in the sequence, masked
    record = traj.to_dict()
    masked = live.engine.tokenizer.decode([t for t, m in zip(record["input_ids"], record["loss_mask"]) if not m])
    assert "<tool_response>\n5\n</tool_response>" in masked
    assert traj.conv.drift().kind is None


def run_agents_sdk(base_url: str, api_key: str, question: str | list, instructions: str | None = None):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def run():
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        model = agents.OpenAIChatCompletionsModel(model="scaffold", openai_client=client)
        agent = agents.Agent(name="adder", instructions=instructions, tools=[add], model=model)
        return await agents.Runner.run(agent, question, max_turns=4)

    return asyncio.run(run())


def test_openai_agents_sdk_with_a_function_tool(live):
    sid = live.open_session()
    result = run_agents_sdk(f"{live.url}/sessions/{sid}/v1", "none", "Add 2 and 3.")
    assert result.final_output == "The answer is 5."
    assert_one_tool_conversation(live, sid)


def run_langchain(base_url: str, api_key: str, messages: list):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = ChatOpenAI(model="scaffold", base_url=base_url, api_key=api_key, max_retries=0).bind_tools([add])
    reply = llm.invoke(messages)
    messages = [*messages, reply]
    for call in reply.tool_calls:
        messages.append(ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"]))
    return reply, llm.invoke(messages)


def test_langchain_chat_openai_with_bound_tools(live):
    from langchain_core.messages import HumanMessage

    sid = live.open_session()
    first, final = run_langchain(f"{live.url}/sessions/{sid}/v1", "none", [HumanMessage("Add 2 and 3.")])
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert final.content == "The answer is 5."
    assert_one_tool_conversation(live, sid)
