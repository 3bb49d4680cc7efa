"""The Responses and Messages dialects and the constraints, at the wire: what is refused, and how it is said."""

from __future__ import annotations

import json

import pytest
from serve_helpers import ADD_TOOL, TrackingEngine, serving

from scaffold_core.engines.canned import CannedBenchmarkEngine

httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def scripted():
    with serving(TrackingEngine()) as server:
        yield server


@pytest.fixture(scope="module")
def canned():
    with serving(CannedBenchmarkEngine()) as server:
        yield server


FORCED = {
    "chat/completions": {"messages": [{"role": "user", "content": "Add 2 and 3."}], "tools": [ADD_TOOL],
                         "tool_choice": "required"},
    "responses": {"input": "Add 2 and 3.", "text": {"format": {"type": "json_schema", "name": "n",
                                                                "schema": {"type": "object"}}}},
    "messages": {"max_tokens": 16, "messages": [{"role": "user", "content": "Add 2 and 3."}],
                 "tools": [{"name": "add", "input_schema": ADD_TOOL["function"]["parameters"]}],
                 "tool_choice": {"type": "any"}},
}


@pytest.mark.parametrize("route", sorted(FORCED))
def test_an_engine_that_cannot_constrain_says_so_in_one_400(canned, route):
    reply = httpx.post(f"{canned.url}/v1/{route}", json={"model": "scaffold", **FORCED[route]}, timeout=10)
    assert reply.status_code == 400, reply.text
    body = reply.json()
    message = body["error"]["message"]
    assert "needs grammar-constrained decoding, which the engine" in message and "xgrammar" in message
    if route == "messages":  # Anthropic's shape
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["code"] == "constraint_unsupported"


def test_a_json_schema_holds_the_output_to_it(scripted):
    schema = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"],
              "additionalProperties": False}
    reply = scripted.client().chat.completions.create(
        model="scaffold", messages=[{"role": "user", "content": "Hi"}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    assert json.loads(reply.choices[0].message.content) == {"value": 5}
    named = scripted.client().chat.completions.create(
        model="scaffold", messages=[{"role": "user", "content": "Hi"}], tools=[ADD_TOOL],
        tool_choice={"type": "function", "function": {"name": "add"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "add" and named.choices[0].finish_reason == "tool_calls"


def test_stop_strings_are_cut_from_the_content_streamed_or_not(scripted):
    client = scripted.client()
    ask = {"model": "scaffold", "messages": [{"role": "user", "content": "Hi"}], "stop": [" there"]}
    assert client.chat.completions.create(**ask).choices[0].message.content == "Hello"
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(**ask, stream=True)
              if c.choices]
    assert "".join(pieces) == "Hello"
    anthropic = httpx.post(f"{scripted.url}/v1/messages", timeout=10, json={
        "model": "scaffold", "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}],
        "stop_sequences": [" there"]}).json()
    assert anthropic["content"][0]["text"] == "Hello" and anthropic["stop_reason"] == "stop_sequence"
    assert anthropic["stop_sequence"] == " there"


@pytest.mark.parametrize("route, body, needle", [
    ("responses", {"input": "Hi", "tools": [{"type": "computer"}]}, "only function tools"),
    ("responses", {"input": "Hi", "previous_response_id": "resp_nope"}, "no stored response"),
    ("responses", {"input": [{"type": "item_reference", "id": "x"}]}, "not served"),
    ("messages", {"messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
    ("messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "not served"),
])
def test_bad_requests_name_the_problem_in_the_dialects_shape(scripted, route, body, needle):
    reply = httpx.post(f"{scripted.url}/v1/{route}", json={"model": "scaffold", **body}, timeout=10)
    assert reply.status_code in (400, 404), reply.text
    error = reply.json()["error"]
    assert needle in error["message"]
    if route == "messages":
        assert reply.json()["type"] == "error"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings", "/sessions/x/v1/audio/speech"])
def test_routes_not_served_say_what_is(scripted, path):
    reply = httpx.post(f"{scripted.url}{path}", json={}, timeout=10)
    assert reply.status_code == 404
    message = reply.json()["error"]["message"]
    assert "POST /v1/chat/completions" in message and "POST /v1/messages" in message
