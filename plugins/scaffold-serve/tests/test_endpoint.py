"""The endpoint with real, unmodified clients (openai sync and async, streaming, n > 1, logprobs) on a scripted engine.

One server for the module; every test opens its own session.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from scaffold_testkit import ScriptedEngine
from serve_helpers import ADD_TOOL, LiveServer, TrackingEngine, tool_result

from scaffold_core.sampling import SamplingParams
from scaffold_serve.service import ServeOptions

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def live():
    server = LiveServer(TrackingEngine())
    try:
        yield server
    finally:
        server.close()


def engine_logprob(token: int) -> float:
    """What the scripted engine reports for a token (a deterministic function of the id)."""
    return -(1.0 + math.sin(token)) / 2.0 - 0.01


def test_a_tool_conversation_is_one_token_faithful_trajectory(live):
    sid = live.open_session()
    client = live.client(sid)
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    first = client.chat.completions.create(model="scaffold", messages=messages, tools=[ADD_TOOL])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "add" and call.function.arguments == '{"a": 2, "b": 3}'
    assert first.choices[0].message.content == "Let me add."
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": tool_result(call)}]
    second = client.chat.completions.create(model="scaffold", messages=messages, tools=[ADD_TOOL])
    assert second.choices[0].message.content == "The answer is 5."

    session = live.session(sid)
    assert session.counts["extend"] == 1 and session.drift_count == 0 and len(session.trajectories) == 1
    traj = session.trajectories[0]
    calls = session.calls
    ids = traj.ids()
    # the prefix invariant: call 2's prompt is call 1's prompt + the ids it sampled + the tool result's tokens
    first_prompt = ids[:calls[0]["prompt_len"]]
    first_out = calls[0]["choices"][0]["output_ids"]
    assert ids[:calls[1]["prompt_len"]][:len(first_prompt) + len(first_out)] == first_prompt + first_out
    assert calls[1]["prompt_len"] + len(calls[1]["choices"][0]["output_ids"]) == len(ids)
    # every model turn kept, trained; everything else masked; logprobs are the engine's, never placeholders
    record = traj.to_dict()
    sampled = [t for t, m in zip(ids, record["loss_mask"]) if m]
    assert sampled == first_out + calls[1]["choices"][0]["output_ids"]
    assert [lp for lp, m in zip(record["logprobs"], record["loss_mask"]) if m] == [engine_logprob(t) for t in sampled]
    assert all(lp == 0.0 for lp, m in zip(record["logprobs"], record["loss_mask"]) if not m)
    assert [t.text for t in traj.conv.turns] == [
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', "The answer is 5."]
    assert "<tool_response>\n5\n</tool_response>" in live.engine.tokenizer.decode(ids)
    assert traj.conv.drift().kind is None


def test_n_choices_with_logprobs_each_continue_their_own_trajectory(live):
    sid = live.open_session()
    reply = live.client(sid).chat.completions.create(
        model="scaffold", messages=[{"role": "user", "content": "Hi"}], n=3, logprobs=True, seed=7)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    for choice in reply.choices:
        tokens = choice.logprobs.content
        assert len(tokens) == reply.usage.completion_tokens // 3
        assert all(t.top_logprobs == [] for t in tokens)
    session = live.session(sid)
    assert [t.origin for t in session.trajectories] == ["new", "choice", "choice"]
    recorded = session.calls[0]["choices"][1]
    assert [t.logprob for t in reply.choices[1].logprobs.content] == recorded["logprobs"]
    assert recorded["logprobs"] == [engine_logprob(t) for t in recorded["output_ids"]]


def test_async_streaming_ends_with_usage_and_is_recorded(live):
    sid = live.open_session()

    async def chat():
        async with live.async_client(sid) as client:
            stream = await client.chat.completions.create(
                model="scaffold", messages=[{"role": "user", "content": "Add 2 and 3."}], tools=[ADD_TOOL],
                stream=True, stream_options={"include_usage": True})
            return [chunk async for chunk in stream]

    chunks = asyncio.run(chat())
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.function.name, tc.function.arguments) for tc in calls] == [("add", '{"a": 2, "b": 3}')]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        live.session(sid).calls[0]["choices"][0]["output_ids"])


def test_editing_history_is_drift_measured_and_split(live):
    sid = live.open_session()
    client = live.client(sid)
    messages = [{"role": "user", "content": "Hi"}]
    first = client.chat.completions.create(model="scaffold", messages=messages)
    edited = [*messages, {"role": "assistant", "content": "Something else entirely."},
              {"role": "user", "content": "Hi again"}]
    again = client.chat.completions.create(model="scaffold", messages=edited)
    assert again.choices[0].message.content == "Hello there."  # the call still works
    session = live.session(sid)
    assert session.drift_count == 1 and len(session.trajectories) == 2
    drift = session.trajectories[1].drift
    assert drift["kind"] == "edited" and drift["message"] == 1 and drift["trajectory"] == 0
    assert 0 < drift["position"] < len(session.trajectories[0].ids())
    assert drift["dropped_tokens"] == len(session.trajectories[0].ids()) - drift["position"]
    # the original conversation is intact
    assert session.trajectories[0].conv.turns[0].text == first.choices[0].message.content


def test_a_retry_from_an_earlier_turn_forks_without_drift(live):
    sid = live.open_session()
    client = live.client(sid)
    history = [{"role": "user", "content": "Hi"}]
    first = client.chat.completions.create(model="scaffold", messages=history)
    history += [first.choices[0].message.model_dump(exclude_none=True)]
    client.chat.completions.create(model="scaffold", messages=[*history, {"role": "user", "content": "A"}])
    client.chat.completions.create(model="scaffold", messages=[*history, {"role": "user", "content": "B"}])
    session = live.session(sid)
    assert session.drift_count == 0 and session.counts["fork"] == 1 and session.counts["extend"] == 1
    a, b = session.trajectories
    assert b.origin == "fork" and b.parent == 0
    shared = session.calls[1]["prompt_len"] - 0
    assert a.ids()[:len(first.choices[0].message.content)] == b.ids()[:len(first.choices[0].message.content)]
    assert shared > 0 and b.conv.output_mask[:len(first.choices[0].message.content)] == [1] * len(
        first.choices[0].message.content)


def test_calls_without_a_session_are_served(live):
    reply = live.client().chat.completions.create(model="scaffold", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Hello there."
    assert [m.id for m in live.client().models.list().data] == ["scaffold"]


def test_a_header_names_the_session_for_clients_that_keep_their_base_url(live):
    sid = live.open_session()
    client = live.client(default_headers={"X-Scaffold-Session": sid})
    client.chat.completions.create(model="scaffold", messages=[{"role": "user", "content": "Hi"}])
    assert live.session(sid).counts["calls"] == 1


def test_a_format_the_chat_template_cannot_render_is_a_clear_400():
    from scaffold_multiturn.tool_formats import NativeFormat

    server = LiveServer(TrackingEngine(), tool_format=NativeFormat())  # the byte tokenizer's template ignores tools=
    try:
        with pytest.raises(openai.BadRequestError, match="ignores tools=.*hermes"):
            server.client().chat.completions.create(model="scaffold", messages=[{"role": "user", "content": "Hi"}],
                                                    tools=[ADD_TOOL])
        reply = server.client().chat.completions.create(model="scaffold", messages=[{"role": "user", "content": "x"}])
        assert reply.choices[0].message.content == "Hello there."
    finally:
        server.close()


def test_calls_are_tagged_by_the_configured_header_and_a_session_may_take_the_requests_sampling():
    """One client running two agents through one session names each agent's calls (verifiers' clients send
    X-Session-ID); each conversation carries the tags of the calls that made it. A side session opened with
    sampling_from=request honours the client's temperature while the service's own sessions keep the config's."""
    from scaffold_serve.backends import EngineBackend

    options = ServeOptions(sampling=SamplingParams(max_tokens=64, temperature=1.0), sampling_from="config",
                           tag_header="X-Session-ID")
    server = LiveServer(ScriptedEngine("fine"), options=options)
    try:
        sid = server.open_session()
        client = server.client(sid)
        ask = [{"role": "user", "content": "hi"}]
        for agent in ("run-a", "run-b"):
            client.chat.completions.create(model="scaffold", messages=ask, temperature=0.0,
                                           extra_headers={"X-Session-ID": agent})
        session = server.session(sid)
        assert [c["tag"] for c in session.calls] == ["run-a", "run-b"]
        assert [t.tags for t in session.trajectories] == [["run-a"], ["run-b"]]
        assert all(r.sampling.temperature == 1.0 for r in server.engine.requests)  # the config's, not the client's
        service = server.service
        assert service is not None

        async def open_side():  # sessions are touched on the server's event loop only
            return service.open_session(EngineBackend(server.engine, seed=0), sampling_from="request")

        side = server.loop.run(open_side(), 10)
        server.client(side.id).chat.completions.create(model="scaffold", messages=ask, temperature=0.0)
        assert server.engine.requests[-1].sampling.temperature == 0.0
    finally:
        server.close()
