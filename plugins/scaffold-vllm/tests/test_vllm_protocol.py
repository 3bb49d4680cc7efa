"""The wire formats, checked against vLLM's request and response models (as the test server writes them)."""

from __future__ import annotations

import json

import orjson
import pytest
import vllm_test_server as ts
from scaffold_remote.client import ProtocolError
from scaffold_vllm.protocol import (
    COMPLETIONS_EXTRA,
    GENERATE_EXTRA,
    MANAGED_KEYS,
    CompletionsProtocol,
    GenerateProtocol,
    check_extra_sampling,
    completions_body,
    generate_body,
    parse_completions_response,
    parse_generate_response,
)

from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams


def request(seed: int | None = 12345, **sampling) -> GenerationRequest:
    return GenerationRequest("req-1", [11, 12, 13], SamplingParams(**{"max_tokens": 7, **sampling}), seed=seed,
                             episode_id="ep-1")


# -- requests ------------------------------------------------------------------


def test_every_sampling_field_is_mapped_one_to_one_and_max_tokens_always_sent():
    body = generate_body(request(temperature=0.7, top_p=0.9, top_k=40, stop=("\n\n", "###"), stop_token_ids=(2, 5),
                                 top_logprobs=3), "rid-1")
    assert body == {"request_id": "rid-1", "token_ids": [11, 12, 13], "sampling_params": {
        "max_tokens": 7, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "logprobs": 3, "seed": 12345,
        "stop": ["\n\n", "###"], "stop_token_ids": [2, 5]}}
    plain = generate_body(request(seed=None), "r")["sampling_params"]
    assert plain == {"max_tokens": 7, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": 0}


def test_only_names_vllm_knows_are_ever_sent():
    """vLLM drops an unknown sampling key without a word: every name scaffold sends is one of SamplingParams'."""
    assert (MANAGED_KEYS | GENERATE_EXTRA) <= ts.SAMPLING_FIELDS
    assert (MANAGED_KEYS | COMPLETIONS_EXTRA) <= ts.COMPLETION_FIELDS
    body = completions_body(request(), "r", "served")
    assert set(body) <= ts.COMPLETION_FIELDS
    assert body["return_tokens_as_token_ids"] is True and body["max_tokens"] == 7 and body["prompt"] == [11, 12, 13]


def test_seeds_are_sent_as_63_bit_integers():
    assert generate_body(request(seed=(1 << 64) - 1), "r")["sampling_params"]["seed"] == (1 << 63) - 1


def test_the_fast_encoder_writes_the_same_json_as_the_body():
    protocol = GenerateProtocol({"min_p": 0.05})
    for r in (request(), request(seed=7), request(seed=None, temperature=0.0, stop=("x",))):
        assert json.loads(protocol.encode(r, "rid-9")) == generate_body(r, "rid-9", {"min_p": 0.05})
    other = request(seed=8)
    assert json.loads(protocol.encode(other, "r"))["sampling_params"]["seed"] == 8  # seeds are not cached together
    assert json.loads(CompletionsProtocol("m").encode(request(), "r")) == completions_body(request(), "r", "m")


def test_extra_sampling_is_checked_against_what_vllm_accepts():
    assert check_extra_sampling({"min_p": 0.1, "repetition_penalty": 1.1}) == {"min_p": 0.1,
                                                                                 "repetition_penalty": 1.1}
    with pytest.raises(ValueError, match=r"'min_pp' is not a sampling field of vLLM's /inference/v1/generate "
                                         r"\(vLLM would drop it without a word\); allowed: .*min_p"):
        check_extra_sampling({"min_pp": 0.1})
    with pytest.raises(ValueError, match="'max_tokens', 'seed' come from the run's `sampling:` section"):
        check_extra_sampling({"max_tokens": 5, "seed": 1})


# -- responses -----------------------------------------------------------------

GENERATE_ANSWER = {
    "request_id": "generate-tokens-r", "model": "m", "created": 1,
    "usage": {"prompt_tokens": 3, "completion_tokens": 3},
    "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [70, 71, 2], "logprobs": {"content": [
        {"token": "token_id:70", "logprob": -0.5, "bytes": None, "top_logprobs": [
            {"token": "token_id:70", "logprob": -0.5}, {"token": "token_id:80", "logprob": -1.5}]},
        {"token": "token_id:71", "logprob": -0.25, "bytes": None, "top_logprobs": [
            {"token": "token_id:71", "logprob": -0.25}, {"token": "token_id:81", "logprob": -2.0}]},
        {"token": "token_id:2", "logprob": -9999.0, "bytes": None, "top_logprobs": []},
    ]}}],
}


def test_a_generate_answer_gives_the_servers_ids_and_logprobs():
    result = parse_generate_response(GENERATE_ANSWER, top_logprobs=1)
    assert result.output_ids == [70, 71, 2] and result.logprobs == [-0.5, -0.25, -9999.0]
    assert result.finish_reason == "stop" and result.text == "" and result.meta["server_text"] is False
    assert result.top_logprobs == [{70: -0.5, 80: -1.5}, {71: -0.25, 81: -2.0}, {}]
    assert result.meta["completion_tokens"] == 3
    assert parse_generate_response(GENERATE_ANSWER).top_logprobs is None  # not asked: the sampled entry is not kept


def test_the_newer_integer_token_id_shape_is_read_too():
    answer = json.loads(json.dumps(GENERATE_ANSWER))
    for entry in answer["choices"][0]["logprobs"]["content"]:
        entry["token_id"] = int(entry.pop("token").split(":")[1])
        for alt in entry["top_logprobs"]:
            alt["token_id"] = int(alt.pop("token").split(":")[1])
    result = parse_generate_response(answer, top_logprobs=1)
    assert result.output_ids == [70, 71, 2] and result.top_logprobs[1] == {71: -0.25, 81: -2.0}


@pytest.mark.parametrize("change, error", [
    (lambda c: c.update(token_ids=[70, 72, 2]), "names token 71 where token_ids has 72"),
    (lambda c: c.update(logprobs=None), "no logprobs"),
    (lambda c: c["logprobs"]["content"].pop(), "differ in length"),
    (lambda c: c.update(finish_reason="eos"), "unknown finish_reason 'eos'"),
    (lambda c: c["logprobs"]["content"][0].update(token="hello"), "is text, not 'token_id:<id>'"),
    (lambda c: c.update(token_ids=[70, "71", 2]), "list of integers"),
])
def test_an_inconsistent_generate_answer_is_refused_not_guessed(change, error):
    answer = json.loads(json.dumps(GENERATE_ANSWER))
    change(answer["choices"][0])
    with pytest.raises(ProtocolError, match=error):
        parse_generate_response(answer)


def test_top_logprobs_all_named_after_the_sampled_token_are_refused():
    """An older vLLM labels every alternative with the sampled token's id: their ids are lost."""
    answer = json.loads(json.dumps(GENERATE_ANSWER))
    for entry in answer["choices"][0]["logprobs"]["content"]:
        for alt in entry["top_logprobs"]:
            alt["token"] = entry["token"]
    with pytest.raises(ProtocolError, match="names each alternative after the sampled token"):
        parse_generate_response(answer, top_logprobs=2)


def test_an_error_finish_is_an_abort_the_runtime_retries():
    answer = json.loads(json.dumps(GENERATE_ANSWER))
    answer["choices"][0]["finish_reason"] = "error"
    result = parse_generate_response(answer)
    assert result.finish_reason == "abort" and "error" in result.meta["message"]


COMPLETION_ANSWER = {
    "id": "cmpl-r", "object": "text_completion", "model": "m",
    "choices": [{"index": 0, "text": "hi", "finish_reason": "length", "stop_reason": None, "token_ids": [70, 71],
                 "logprobs": {"text_offset": [0, 1], "token_logprobs": [-0.5, None],
                              "tokens": ["token_id:70", "token_id:71"],
                              "top_logprobs": [{"token_id:70": -0.5, "token_id:90": -3.0},
                                               {"token_id:71": -0.2}]}}],
}


def test_a_completions_answer_with_token_id_strings():
    result = parse_completions_response(COMPLETION_ANSWER, top_logprobs=1)
    assert result.output_ids == [70, 71] and result.logprobs[0] == -0.5 and result.logprobs[1] != result.logprobs[1]
    assert result.meta["null_logprobs"] == 1 and result.text == "hi" and result.meta["server_text"] is True
    assert result.top_logprobs == [{70: -0.5, 90: -3.0}, {71: -0.2}] and result.finish_reason == "length"
    without_ids = json.loads(json.dumps(COMPLETION_ANSWER))
    del without_ids["choices"][0]["token_ids"]  # a vLLM older than return_token_ids: the strings carry the ids
    assert parse_completions_response(without_ids).output_ids == [70, 71]


def test_completions_tokens_as_text_are_refused_rather_than_re_tokenized():
    answer = json.loads(json.dumps(COMPLETION_ANSWER))
    del answer["choices"][0]["token_ids"]
    answer["choices"][0]["logprobs"]["tokens"] = ["h", "i"]
    with pytest.raises(ProtocolError, match="did not return token ids"):
        parse_completions_response(answer)
    disagree = json.loads(json.dumps(COMPLETION_ANSWER))
    disagree["choices"][0]["token_ids"] = [70, 72]
    with pytest.raises(ProtocolError, match="disagree"):
        parse_completions_response(disagree)


def test_the_protocols_read_what_the_test_server_writes():
    """The parse functions against bytes as the server sends them (orjson, the hot path's decoder)."""
    payload = orjson.dumps(GENERATE_ANSWER)
    assert GenerateProtocol().parse(payload, "r", request(top_logprobs=2)).top_logprobs[0] == {70: -0.5, 80: -1.5}
    assert CompletionsProtocol("m").parse(orjson.dumps(COMPLETION_ANSWER), "r", request()).output_ids == [70, 71]


def test_a_constraint_goes_out_as_vllms_structured_outputs_on_both_endpoints():
    """A forced tool call or JSON output (scaffold-serve) is enforced by vLLM's own structured-output backend."""
    from scaffold_vllm.engine import VLLMEngine
    from scaffold_vllm.protocol import completions_body, generate_body

    from scaffold_core.sampling import Constraint

    expected = {"json_schema": "json", "regex": "regex", "ebnf": "grammar", "structural_tag": "structural_tag"}
    for kind, field in expected.items():
        request = GenerationRequest("r", [1, 2], SamplingParams(max_tokens=8, constraint=Constraint(kind, "spec")))
        assert generate_body(request, "r")["sampling_params"]["structured_outputs"] == {field: "spec"}
        assert completions_body(request, "r", None)["structured_outputs"] == {field: "spec"}
        assert kind in VLLMEngine.constraints
    plain = GenerationRequest("r", [1], SamplingParams(max_tokens=8))
    assert "structured_outputs" not in generate_body(plain, "r")["sampling_params"]
