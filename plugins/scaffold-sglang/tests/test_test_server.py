"""The protocol test server follows the documented SGLang behaviour the client tests rely on.

Raw HTTP (no scaffold client), so a mistake in the client cannot hide one in the server.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from scaffold_remote.client import error_message
from sglang_testkit import byte_server, run, ts

from scaffold_sglang.protocol import parse_generate_response


async def call(url: str, method: str, path: str, body=None, headers=None):
    async with aiohttp.ClientSession(headers=headers or {}) as session:
        data = None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        async with session.request(method, url + path, data=data) as resp:
            text = await resp.text()
            return resp.status, text


def served(server, requests):
    async def main():
        async with ts.running(server) as url:
            out = []
            for r in requests:
                out.append(await call(url, *r))
            return out

    return run(main())


def test_literal_request_examples_are_answered():
    # sglang-api.md §7.1, sent as documented (text input).
    plain = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 32}}
    with_logprobs = {**plain, "stream": False, "return_logprob": True, "top_logprobs_num": 3,
                     "return_text_in_logprobs": True, "logprob_start_len": 0}
    (s1, t1), (s2, t2) = served(byte_server(), [("POST", "/generate", plain), ("POST", "/generate", with_logprobs)])
    assert s1 == s2 == 200
    first, second = json.loads(t1), json.loads(t2)
    assert first["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert "output_token_logprobs" not in first["meta_info"]  # only with return_logprob
    result = parse_generate_response(second)
    assert result.output_ids == second["output_ids"] and len(result.logprobs) == len(result.output_ids) <= 32
    assert second["meta_info"]["input_token_logprobs"][0][0] is None


def test_batches_n_and_rids_follow_the_documented_shapes():
    batch = {"input_ids": [[5, 6], [7, 8, 9]], "rid": "abc", "sampling_params": {"max_new_tokens": 3},
             "return_logprob": True}
    parallel = {"input_ids": [5, 6], "rid": "xyz", "sampling_params": {"max_new_tokens": 3, "n": 2}}
    mixed_n = {"input_ids": [[5], [6]], "sampling_params": [{"n": 1}, {"n": 2}]}
    (sb, tb), (sp, tp), (sm, tm) = served(byte_server(), [("POST", "/generate", batch),
                                                          ("PUT", "/generate", parallel),
                                                          ("POST", "/generate", mixed_n)])
    assert sb == 200 and [o["meta_info"]["id"] for o in json.loads(tb)] == ["abc_0", "abc_1"]
    assert [o["meta_info"]["prompt_tokens"] for o in json.loads(tb)] == [2, 3]
    samples = json.loads(tp)
    assert sp == 200 and len(samples) == 2 and all(o["meta_info"]["id"] != "xyz" for o in samples)
    assert sm == 400 and "parallel_sample_num" in tm


@pytest.mark.parametrize("compat, status, shape", [("0.5.23", 400, "string"), ("0.5.8", 500, "text")])
def test_unknown_sampling_keys_are_refused_like_the_version_imitated(compat, status, shape):
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "seed": 7}}
    ((code, text),) = served(byte_server(compat=compat), [("POST", "/generate", body)])
    assert code == status
    if shape == "string":
        assert isinstance(json.loads(text)["error"], str) and "unknown field `seed`" in text
    else:
        assert text == "Internal Server Error"


@pytest.mark.parametrize("body, message", [
    ({"input_ids": []}, "input_ids cannot be empty."),
    ({"sampling_params": {}}, "Either text, input_ids or input_embeds should be provided."),
    ({"input_ids": [1], "sampling_params": {"top_p": 1.5}}, "top_p must be in (0, 1], got 1.5."),
    ({"input_ids": [1], "sampling_params": {"temperature": "0.5"}}, "expected f64"),
    ({"input_ids": [1] * 20}, "The input (20 tokens) is longer than the model's context length (16 tokens)."),
    ({"input_ids": [1] * 12, "sampling_params": {"max_new_tokens": 5}}, "maximum context length of 16 tokens"),
    ({"input_ids": ["a"]}, "valid list of integers"),
])
def test_bad_requests_get_sglangs_error_bodies(body, message):
    ((code, text),) = served(byte_server(context_length=16), [("POST", "/generate", body)])
    assert code == 400 and message in error_message(code, text)


def test_duplicate_live_rid_and_abort_by_prefix():
    server = byte_server(backend_options={"token_delay_s": 0.02, "mean_tokens": 500})

    async def main():
        async with ts.running(server) as url:
            body = {"input_ids": [1, 2], "rid": "req1", "sampling_params": {"max_new_tokens": 400}}
            first = asyncio.ensure_future(call(url, "POST", "/generate", body))
            other = asyncio.ensure_future(call(url, "POST", "/generate", {**body, "rid": "req10"}))
            while len(server.live) < 2:
                await asyncio.sleep(0.01)
            dup = await call(url, "POST", "/generate", body)
            aborted = await call(url, "POST", "/abort_request", {"rid": "req1"})  # prefix: req10 too
            return dup, aborted, await first, await other

    dup, aborted, first, other = run(main())
    assert dup[0] == 400 and "Duplicate request ID detected: req1" in dup[1]
    assert aborted == (200, "")
    for status, text in (first, other):
        assert status == 200 and json.loads(text)["meta_info"]["finish_reason"]["type"] == "abort"


def test_health_info_and_auth_endpoints():
    server = byte_server(api_key="k", warmup_delay_s=60)
    answers = served(server, [("GET", "/health", None), ("GET", "/model_info", None),
                              ("GET", "/get_model_info", None, {"Authorization": "Bearer k"}),
                              ("GET", "/server_info", None, {"Authorization": "Bearer k"})])
    assert answers[0][0] == 503  # still warming up; health needs no key
    assert answers[1] == (401, '{"error": "Unauthorized"}')
    info = json.loads(answers[2][1])
    assert {"model_path", "tokenizer_path", "weight_version", "is_generation"} <= set(info)
    assert json.loads(answers[3][1])["context_length"] == server.context_length


def test_pause_modes_and_update_weights_failure_shape():
    answers = served(byte_server(), [
        ("POST", "/pause_generation", {"mode": "abort"}), ("GET", "/health", None),
        ("POST", "/continue_generation", {}), ("GET", "/health", None),
        ("POST", "/update_weights_from_disk", {"model_path": "/no/such/dir"}),
        ("POST", "/pause_generation", {"mode": "sideways"}),
    ])
    assert answers[0] == (200, '{"message": "Generation paused successfully.", "status": "ok"}')
    assert answers[1][0] == 503 and answers[3][0] == 200  # health is 503 while paused
    status, text = answers[4]
    assert status == 400 and json.loads(text)["success"] is False
    assert answers[5][0] == 400
