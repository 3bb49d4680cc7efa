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
from compat_matrix import found, measure, record
from serve_helpers import ADD_TOOL, LiveServer

from scaffold_core.sampling import SamplingParams
from scaffold_multiturn.tool_formats import HermesFormat
from scaffold_serve.service import ServeOptions

pytestmark = [pytest.mark.slow]
torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")

EXAMPLES = ((1, 2), (4, 6))
ENGINE = "SmolLM2-135M"
FORCED = "teacher-forced"


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


def examples_items() -> list[dict]:
    """The two examples as the Agents SDK's input items (the Responses API's shape)."""
    items: list[dict] = []
    for i, (a, b) in enumerate(EXAMPLES):
        items += [{"role": "user", "content": f"Add {a} and {b}."},
                  {"type": "function_call", "call_id": f"call_ex{i}", "name": "add",
                   "arguments": json.dumps({"a": a, "b": b})},
                  {"type": "function_call_output", "call_id": f"call_ex{i}", "output": str(a + b)},
                  {"role": "assistant", "content": f"The answer is {a + b}."}]
    return items


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


def check_teacher_forced(smol, record, constrained=()):
    """Every model token's recorded logprob is the model's own, teacher-forced over the whole trajectory (|delta| <=
    1e-3). ``constrained``: (start, length, constraint) of the turns decoded under a grammar, whose logprobs are
    those of the distribution the grammar left (the grammar replayed over the recorded tokens)."""
    from scaffold_core.sampling import Constraint
    from scaffold_transformers.grammar import mask_logits

    ids, mask, logprobs = record["input_ids"], record["loss_mask"], record["logprobs"]
    with torch.no_grad():
        logits = smol.engine.model(input_ids=torch.tensor([ids])).logits[0].float()
    for start, length, spec in constrained:
        grammar = smol.engine._grammars.row(Constraint(spec["kind"], spec["spec"], spec["reason"]))
        for i in range(start, start + length):
            mask_logits([grammar], logits[i - 1:i])
            grammar.accept(ids[i])
    forced = torch.log_softmax(logits, dim=-1)
    positions = [i for i, m in enumerate(mask) if m]
    assert positions and positions[0] > 0
    deltas = [abs(forced[i - 1, ids[i]].item() - logprobs[i]) for i in positions]
    assert max(deltas) <= 1e-3, max(deltas)  # the model's own logprobs, so no placeholders


def check_session_teacher_forced(smol, session):
    """Every conversation of the session, its constrained turns under their grammars."""
    for traj in session.trajectories:
        record_ = traj.to_dict()
        constrained = []
        for call in session.calls:
            for choice in call["choices"]:
                at = found(record_["input_ids"], choice["output_ids"], record_["loss_mask"])
                if call["constraint"] is not None and at >= 0:
                    constrained.append((at, len(choice["output_ids"]), call["constraint"]))
        check_teacher_forced(smol, record_, constrained)


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
    record("openai", "chat completions, tools", ENGINE, False, measure(smol.session(sid), FORCED))


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

    items = examples_items()
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


def test_agents_sdk_default_mode_is_token_faithful(smol):
    """The Agents SDK as it comes (the Responses API), given only the server as its default client."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    items = examples_items()
    sid = smol.open_session()
    agents.set_default_openai_client(AsyncOpenAI(base_url=f"{smol.url}/sessions/{sid}/v1", api_key="none",
                                                 max_retries=0), use_for_tracing=False)
    agent = agents.Agent(name="adder", tools=[add], model="scaffold")
    result = asyncio.run(agents.Runner.run(agent, [*items, {"role": "user", "content": "Add 7 and 8."}],
                                           max_turns=4))
    assert result.final_output == "The answer is 15."
    check_trajectory(smol, sid, "The answer is 15.")
    record("openai-agents", "default (responses), tools", ENGINE, False, measure(smol.session(sid), FORCED))


def test_smolagents_forced_tool_calls_and_rewritten_history_are_token_faithful(smol):
    """smolagents' ToolCallingAgent: every call forces a tool (decoded under the grammar: the calls parse, their
    logprobs are those of the grammar's distribution) and every step comes back rewritten (an edit: a new sample
    of the same run). Each conversation is still exactly what the model sampled."""
    smolagents = pytest.importorskip("smolagents")
    from serve_helpers import smolagents_add_tool

    sid = smol.open_session()
    model = smolagents.OpenAIServerModel(model_id="scaffold", api_base=f"{smol.url}/sessions/{sid}/v1",
                                         api_key="none")
    agent = smolagents.ToolCallingAgent(tools=[smolagents_add_tool()], model=model, verbosity_level=0, max_steps=2)
    agent.run("Add 5 and 9.")
    session = smol.session(sid)
    forced = [c for c in session.calls if c["constraint"] is not None]
    assert forced and all(ch["message"].get("tool_calls") for c in forced for ch in c["choices"])
    assert session.drift_count >= 1 and len(session.trajectories) >= 2
    check_session_teacher_forced(smol, session)
    record("smolagents", "ToolCallingAgent (defaults)", ENGINE, False, measure(session, FORCED))


def test_logprob_bytes_rebuild_partial_characters(smol):
    """A character split over several tokens: each token's bytes are its own, and together they are the text."""
    from scaffold_serve.token_bytes import token_bytes, token_text

    tokenizer = smol.engine.tokenizer
    text = "café 😀 naïve"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [token_bytes(tokenizer, t) for t in ids]
    assert b"".join(pieces) == text.encode()
    partial = [p for p in pieces if token_text(p).startswith("bytes:")]
    assert partial and all("\ufffd" not in token_text(p) for p in pieces)


def test_streaming_sends_the_content_token_by_token(smol):
    """The embedded engine hands each sampled token to the stream: the content arrives in pieces, as it is decoded,
    and the pieces are exactly the recorded content."""
    sid = smol.open_session()
    stream = smol.client(sid).chat.completions.create(
        model="scaffold", messages=[{"role": "user", "content": "Name three colors."}], max_tokens=12, stream=True)
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 3, pieces
    assert "".join(pieces) == smol.session(sid).calls[0]["choices"][0]["message"]["content"]
