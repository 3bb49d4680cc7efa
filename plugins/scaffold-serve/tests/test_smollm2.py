"""The endpoint on the embedded engine with SmolLM2-135M: real clients hold multi-turn tool conversations, and every
recorded token is what the model sampled: drift 0, each tool turn in the trajectory, and each recorded logprob the
model's own (teacher-forced over the whole trajectory, |delta| <= 1e-3).

One server over the session's shared model; greedy decoding and a two-example prompt make the 135M model call the
tool (the prompt is fixed: its outputs are deterministic). Few calls, short outputs: the model is slow on CPU.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from serve_helpers import ADD_TOOL, LiveServer

from scaffold_core.sampling import SamplingParams
from scaffold_multiturn.tool_formats import HermesFormat
from scaffold_serve.service import ServeOptions

pytestmark = [pytest.mark.slow]
torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")

EXAMPLES = ((1, 2), (4, 6))


@pytest.fixture(scope="module")
def smol(smollm2_engine):
    options = ServeOptions(sampling=SamplingParams(max_tokens=40, temperature=0.0))
    server = LiveServer(smollm2_engine.engine, loop=smollm2_engine.loop, start_engine=False, options=options,
                        tool_format=HermesFormat(response_role="tool"))
    try:
        yield server
    finally:
        server.close()


def examples_openai() -> list[dict]:
    out: list[dict] = []
    for i, (a, b) in enumerate(EXAMPLES):
        call = {"id": f"call_ex{i}", "type": "function",
                "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}
        out += [{"role": "user", "content": f"Add {a} and {b}."}, {"role": "assistant", "content": None,
                                                                    "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"call_ex{i}", "content": str(a + b)},
                {"role": "assistant", "content": f"The answer is {a + b}."}]
    return out


def check_trajectory(smol, sid, answer: str):
    """One trajectory, drift 0, a tool-call turn then the answer, the tool result masked, logprobs the model's."""
    session = smol.session(sid)
    assert session.drift_count == 0 and len(session.trajectories) == 1 and session.counts["extend"] == 1
    traj = session.trajectories[0]
    assert [t.text for t in traj.conv.turns][1] == answer
    assert traj.conv.turns[0].text.startswith('<tool_call>\n{"name": "add"')
    assert traj.conv.drift().kind is None
    record = traj.to_dict()
    tokenizer = smol.engine.tokenizer
    masked = tokenizer.decode([t for t, m in zip(record["input_ids"], record["loss_mask"]) if not m])
    assert "<|im_start|>tool\n<tool_response>\n" in masked
    check_teacher_forced(smol, record)


def check_teacher_forced(smol, record):
    ids, mask, logprobs = record["input_ids"], record["loss_mask"], record["logprobs"]
    with torch.no_grad():
        logits = smol.engine.model(input_ids=torch.tensor([ids])).logits[0].float()
    forced = torch.log_softmax(logits, dim=-1)
    positions = [i for i, m in enumerate(mask) if m]
    assert positions and positions[0] > 0
    deltas = [abs(forced[i - 1, ids[i]].item() - logprobs[i]) for i in positions]
    assert max(deltas) <= 1e-3, max(deltas)  # the model's own logprobs, so no placeholders


def test_openai_sdk_tool_conversation_is_token_faithful(smol):
    sid = smol.open_session()
    client = smol.client(sid)
    messages = [*examples_openai(), {"role": "user", "content": "Add 5 and 9."}]
    first = client.chat.completions.create(model="scaffold", messages=messages, tools=[ADD_TOOL], logprobs=True)
    call = first.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 5, "b": 9})
    recorded = smol.session(sid).calls[0]["choices"][0]
    assert [t.logprob for t in first.choices[0].logprobs.content] == recorded["logprobs"]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "14"}]
    second = client.chat.completions.create(model="scaffold", messages=messages, tools=[ADD_TOOL])
    assert second.choices[0].message.content == "The answer is 14."
    check_trajectory(smol, sid, "The answer is 14.")


def test_async_streaming_with_n_choices_samples_from_the_model(smol):
    sid = smol.open_session()

    async def chat():
        async with smol.async_client(sid) as client:
            stream = await client.chat.completions.create(
                model="scaffold", messages=[{"role": "user", "content": "Name a fruit."}], n=2, temperature=1.0,
                max_tokens=6, seed=3, logprobs=True, stream=True, stream_options={"include_usage": True})
            return [chunk async for chunk in stream]

    chunks = asyncio.run(chat())
    session = smol.session(sid)
    assert [t.origin for t in session.trajectories] == ["new", "choice"]
    assert chunks[-1].usage.completion_tokens == sum(len(c["output_ids"]) for c in session.calls[0]["choices"])
    for index, traj in enumerate(session.trajectories):
        streamed = [t.logprob for c in chunks if c.choices and c.choices[0].index == index
                    for t in (c.choices[0].logprobs.content if c.choices[0].logprobs else [])]
        assert streamed == session.calls[0]["choices"][index]["logprobs"]
        check_teacher_forced(smol, traj.to_dict())


def test_openai_agents_sdk_tool_conversation_is_token_faithful(smol):
    from test_clients import run_agents_sdk

    items: list[dict] = []
    for i, (a, b) in enumerate(EXAMPLES):
        items += [{"role": "user", "content": f"Add {a} and {b}."},
                  {"type": "function_call", "call_id": f"call_ex{i}", "name": "add",
                   "arguments": json.dumps({"a": a, "b": b})},
                  {"type": "function_call_output", "call_id": f"call_ex{i}", "output": str(a + b)},
                  {"role": "assistant", "content": f"The answer is {a + b}."}]
    sid = smol.open_session()
    question = [*items, {"role": "user", "content": "Add 7 and 8."}]
    result = run_agents_sdk(f"{smol.url}/sessions/{sid}/v1", "none", question)
    assert result.final_output == "The answer is 15."
    check_trajectory(smol, sid, "The answer is 15.")


def test_langchain_tool_conversation_is_token_faithful(smol):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from test_clients import run_langchain

    history: list = []
    for i, (a, b) in enumerate(EXAMPLES):
        history += [HumanMessage(f"Add {a} and {b}."),
                    AIMessage("", tool_calls=[{"id": f"call_ex{i}", "name": "add", "args": {"a": a, "b": b}}]),
                    ToolMessage(str(a + b), tool_call_id=f"call_ex{i}"), AIMessage(f"The answer is {a + b}.")]
    sid = smol.open_session()
    first, final = run_langchain(f"{smol.url}/sessions/{sid}/v1", "none", [*history, HumanMessage("Add 5 and 9.")])
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("add", {"a": 5, "b": 9})]
    assert final.content == "The answer is 14."
    check_trajectory(smol, sid, "The answer is 14.")


def test_a_client_killed_mid_stream_stops_its_decoding(smol):
    """The embedded engine drops the row of a request whose client went away, mid-decode, and keeps serving."""
    import time

    httpx = pytest.importorskip("httpx")
    engine = smol.engine
    abandoned, batches = engine.stats()["abandoned"], engine.stats()["batches"]
    body = {"model": "scaffold", "stream": True, "max_tokens": 400, "temperature": 1.0, "seed": 1,
            "messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{smol.url}/v1/chat/completions",
                                                            json=body) as reply:
        chunks = reply.iter_bytes()  # held: a dropped iterator would close the response at once
        assert next(chunks).startswith(b"data: ")
        deadline = time.monotonic() + 60
        while engine.stats()["batches"] == batches and time.monotonic() < deadline:
            time.sleep(0.05)  # until its batch is decoding
    deadline = time.monotonic() + 60
    while engine.stats()["abandoned"] == abandoned and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["abandoned"] == abandoned + 1, engine.stats()
    reply = smol.client().chat.completions.create(model="scaffold", messages=[{"role": "user", "content": "Hi"}],
                                                  max_tokens=3)
    assert reply.usage.completion_tokens <= 3


def test_top_logprobs_are_the_models_most_likely_tokens(smol):
    """``top_logprobs`` gives, per sampled token, the model's most likely tokens there, most likely first; under
    greedy decoding the sampled token is the first of them, at the same logprob."""
    reply = smol.client().chat.completions.create(
        model="scaffold", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, logprobs=True, top_logprobs=3)
    tokens = reply.choices[0].logprobs.content
    assert len(tokens) == reply.usage.completion_tokens > 0
    for token in tokens:
        likely = [t.logprob for t in token.top_logprobs]
        assert len(likely) == 3 and likely == sorted(likely, reverse=True)
        assert token.top_logprobs[0].token == token.token and abs(likely[0] - token.logprob) < 1e-6
