"""Bad and hostile input gets its answer (OpenAI's error body, the right status); the server keeps serving."""

from __future__ import annotations

import socket
import time

import pytest
from serve_helpers import LiveServer, TrackingEngine

from scaffold_core.errors import ConfigError
from scaffold_core.sampling import SamplingParams
from scaffold_serve.server import check_bind, is_loopback
from scaffold_serve.service import ServeOptions

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def live():
    options = ServeOptions(sampling=SamplingParams(max_tokens=256), context_length=2048, max_body_bytes=1 << 20)
    server = LiveServer(TrackingEngine(), options=options)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def keyed():
    server = LiveServer(TrackingEngine(), api_key=KEY)
    try:
        yield server
    finally:
        server.close()


def chat_url(live, sid=None):
    return f"{live.url}/sessions/{sid}/v1/chat/completions" if sid else f"{live.url}/v1/chat/completions"


def ok_body(**changes):
    return {"model": "scaffold", "messages": [{"role": "user", "content": "Hi"}], **changes}


def assert_error(reply, status, param=None, code=None):
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def assert_still_serving(live):
    reply = httpx.post(chat_url(live), json=ok_body(), timeout=30)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "Hello there."


@pytest.mark.parametrize("body, param", [
    (ok_body(temperature="hot"), "temperature"),
    (ok_body(temperature=3), "temperature"),
    (ok_body(max_tokens=-1), "max_tokens"),
    (ok_body(max_tokens=True), "max_tokens"),
    (ok_body(n=0), "n"),
    (ok_body(top_p=0), "top_p"),
    (ok_body(stream="yes"), "stream"),
    (ok_body(stop=[1, 2]), "stop"),
    (ok_body(seed=1.5), "seed"),
    (ok_body(top_logprobs=3), "top_logprobs"),  # without logprobs: true
    (ok_body(top_logprobs=21, logprobs=True), "top_logprobs"),
    (ok_body(tool_choice="required", tools=[]), "tool_choice"),
    (ok_body(tools={"name": "x"}), "tools"),
    (ok_body(tools=[{"type": "function", "function": {"name": 3}}]), "tools[0].function.name"),
    (ok_body(frequency_penalty=0.5), "frequency_penalty"),
    (ok_body(messages="Hi"), "messages"),
    (ok_body(messages=[]), "messages"),
    (ok_body(messages=[{"role": "wizard", "content": "Hi"}]), "messages[0].role"),
    (ok_body(messages=[{"role": "user", "content": 42}]), "messages[0].content"),
    (ok_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages[0].content[0]"),
    (ok_body(messages=[{"role": "tool", "content": "5"}]), "messages[0].tool_call_id"),
    (ok_body(model=None), "model"),
])
def test_wrong_typed_fields_get_a_400_naming_the_field(live, body, param):
    assert_error(httpx.post(chat_url(live), json=body, timeout=30), 400, param=param)


def test_unknown_fields_are_ignored(live):
    body = ok_body(store=False, metadata={"a": "b"}, parallel_tool_calls=True, user="me", service_tier="auto")
    assert httpx.post(chat_url(live), json=body, timeout=30).status_code == 200


@pytest.mark.parametrize("raw", [b"{bad json", b"", b"[1, 2]", b'{"model": "scaffold", "messages": [NaN]}',
                                 b'{"model": "scaffold\xff\xfe"}', b"[" * 200_000 + b"]" * 200_000,
                                 b'{"a":' * 100_000 + b"1" + b"}" * 100_000])
def test_malformed_bodies_get_a_400(live, raw):
    assert_error(httpx.post(chat_url(live), content=raw, headers={"Content-Type": "application/json"}, timeout=30),
                 400)
    assert_still_serving(live)


def test_unknown_model_session_and_route(live):
    assert_error(httpx.post(chat_url(live), json=ok_body(model="gpt-4o"), timeout=30), 404, param="model",
                 code="model_not_found")
    assert_error(httpx.post(chat_url(live, "nosuchsession"), json=ok_body(), timeout=30), 404,
                 code="session_not_found")
    assert_error(httpx.post(chat_url(live), json=ok_body(), headers={"X-Scaffold-Session": "nope"}, timeout=30), 404,
                 code="session_not_found")
    assert_error(httpx.get(f"{live.url}/sessions/nosuchsession", timeout=30), 404, code="session_not_found")
    assert_error(httpx.get(f"{live.url}/v2/everything", timeout=30), 404)
    assert_error(httpx.delete(f"{live.url}/v1/chat/completions", timeout=30), 405)


def test_a_prompt_over_the_context_is_context_length_exceeded(live):
    sid = live.open_session()
    long = ok_body(messages=[{"role": "user", "content": "x" * 3000}])
    assert_error(httpx.post(chat_url(live, sid), json=long, timeout=30), 400, param="messages",
                 code="context_length_exceeded")
    asked = ok_body(max_tokens=2000, messages=[{"role": "user", "content": "x" * 100}])
    assert_error(httpx.post(chat_url(live, sid), json=asked, timeout=30), 400, code="context_length_exceeded")
    huge = ok_body(messages=[{"role": "user", "content": "y" * 200_000}])  # refused before it is tokenized
    assert_error(httpx.post(chat_url(live, sid), json=huge, timeout=30), 400, code="context_length_exceeded")
    assert live.session(sid).counts["calls"] == 0  # nothing recorded for refused calls
    with pytest.raises(openai.BadRequestError) as info:
        live.client(sid).chat.completions.create(**long)
    assert info.value.code == "context_length_exceeded"
    assert_still_serving(live)


def test_huge_bodies_are_refused_before_they_are_read(live):
    huge = b'{"model": "scaffold", "messages": [{"role": "user", "content": "' + b"x" * (2 << 20) + b'"}]}'
    assert_error(httpx.post(chat_url(live), content=huge, timeout=30), 413, code="request_too_large")

    def chunks():  # no Content-Length: counted as it arrives
        yield huge[:1000]
        for i in range(1000, len(huge), 65536):
            yield huge[i:i + 65536]

    assert_error(httpx.post(chat_url(live), content=chunks(), timeout=30), 413, code="request_too_large")
    assert_still_serving(live)


def raw_request(live, data: bytes) -> bytes:
    host, port = live.server.host, live.server.port
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_header_tricks_do_not_crash_it(live):
    body = b'{"model": "scaffold", "messages": [{"role": "user", "content": "Hi"}]}'
    two_lengths = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: "
                   + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert not raw_request(live, two_lengths).startswith(b"HTTP/1.1 200")
    negative = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n" + body
    assert not raw_request(live, negative).startswith(b"HTTP/1.1 200")
    smuggle = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3"
               b"\r\n\r\n0\r\n\r\n")
    assert not raw_request(live, smuggle).startswith(b"HTTP/1.1 200")
    assert_still_serving(live)


@pytest.mark.parametrize("sid", ["..%2F..%2Fetc%2Fpasswd", "%2e%2e", "a" * 65, "x%00y", "semi;colon"])
def test_session_ids_cannot_mean_paths(live, sid):
    reply = httpx.post(f"{live.url}/sessions/{sid}/v1/chat/completions", json=ok_body(), timeout=30)
    assert reply.status_code == 404, reply.text
    for bad_id in ("../x", "a/b", "", "x" * 65, "ü"):
        assert_error(httpx.post(f"{live.url}/sessions", json={"id": bad_id}, timeout=30), 400, param="id")


def test_sessions_and_rewards_reject_bad_values(live):
    sid = live.open_session()
    assert_error(httpx.post(f"{live.url}/sessions", json={"id": sid}, timeout=30), 409)
    for body in ({}, {"reward": "high"}, {"reward": True}, {"answer": 5}, [1]):
        assert_error(httpx.post(f"{live.url}/sessions/{sid}/reward", json=body, timeout=30), 400)
    reply = httpx.post(f"{live.url}/sessions/{sid}/reward", json={"reward": 0.5, "answer": "42"}, timeout=30)
    assert reply.status_code == 200 and reply.json()["reward"] == 0.5


def test_a_client_killed_mid_stream_cancels_its_generation(live):
    cancelled = live.engine.cancelled
    body = ok_body(stream=True, messages=[{"role": "user", "content": "HANG please"}])
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", chat_url(live), json=body) as reply:
            chunks = reply.iter_bytes()  # held: a dropped iterator would close the response at once
            first = next(chunks)
            assert first.startswith(b"data: ") and b'"role":"assistant"' in first
            time.sleep(0.3)
            assert live.engine.cancelled == cancelled  # still generating while the client listens
    # the connection is closed: the server notices and cancels the engine request
    deadline = time.monotonic() + 10
    while live.engine.cancelled == cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert live.engine.cancelled == cancelled + 1
    assert_still_serving(live)


def test_a_client_gone_before_the_reply_cancels_its_generation(live):
    cancelled = live.engine.cancelled
    sid = live.open_session()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(chat_url(live, sid), json=ok_body(messages=[{"role": "user", "content": "HANG"}]), timeout=0.5)
    deadline = time.monotonic() + 10
    while live.engine.cancelled == cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert live.engine.cancelled == cancelled + 1
    assert live.session(sid).counts["calls"] == 0 and live.session(sid).in_flight == 0
    assert_still_serving(live)


def test_a_key_is_required_beyond_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("example.org")
    for host in ("0.0.0.0", "::", "192.168.1.10", "example.org"):
        with pytest.raises(ConfigError, match="--api-key"):
            check_bind(host, None)
        check_bind(host, "a-key")
    check_bind("127.0.0.1", None)


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}, {"Authorization": KEY},
    {"Authorization": f"Bearer {KEY}x"}, {"Authorization": f"Bearer {KEY[:-1]}"}, {"X-Api-Key": "wrong"},
    {"X-Api-Key": KEY, "Authorization": f"Bearer {KEY}"},
    {"Authorization": "Bearer"},
])
def test_every_route_refuses_a_missing_or_wrong_key(keyed, headers):
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("POST", "/sessions"),
                         ("GET", "/sessions"), ("GET", "/health"), ("GET", "/nope")):
        reply = httpx.request(method, f"{keyed.url}{path}?api_key={KEY}", json=ok_body(), headers=headers, timeout=30)
        assert_error(reply, 401, code="invalid_api_key")
        assert reply.headers["www-authenticate"] == "Bearer"


def test_the_right_key_works_and_two_authorization_headers_do_not(keyed):
    reply = httpx.post(chat_url(keyed), json=ok_body(), headers={"Authorization": f"bearer {KEY}"}, timeout=30)
    assert reply.status_code == 200
    client = keyed.client()
    assert client.chat.completions.create(**ok_body()).choices[0].message.content == "Hello there."
    doubled = httpx.Headers([("Authorization", f"Bearer {KEY}"), ("Authorization", "Bearer wrong")])
    assert_error(httpx.post(chat_url(keyed), json=ok_body(), headers=doubled, timeout=30), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="wrong", max_retries=0).chat.completions.create(**ok_body())
