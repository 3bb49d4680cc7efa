"""The wire format, checked against the literal examples of SGLang's API reference (sglang-api.md §7)."""

from __future__ import annotations

import json
import math

import pytest
from scaffold_remote.client import encode_json, error_message

from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_sglang.protocol import (
    SAMPLING_KEYS,
    BodyEncoder,
    ProtocolError,
    check_extra_sampling,
    generate_body,
    parse_generate_response,
    sampling_params,
)


def request(**sampling) -> GenerationRequest:
    return GenerationRequest("req-1", [11, 12, 13], SamplingParams(**{"max_tokens": 7, **sampling}), seed=12345,
                             episode_id="ep-1")


# -- requests ------------------------------------------------------------------


def test_sampling_params_are_mapped_explicitly_and_only_known_keys_are_sent():
    params = sampling_params(request(temperature=0.7, top_p=0.9, top_k=40, stop=("\n\n", "###"),
                                     stop_token_ids=(2, 5)))
    assert params == {"max_new_tokens": 7, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
                      "stop": ["\n\n", "###"], "stop_token_ids": [2, 5]}
    assert set(params) <= SAMPLING_KEYS
    assert "seed" not in params and "sampling_seed" not in params and "max_tokens" not in params


def test_greedy_and_defaults_are_sent_not_left_to_the_server():
    params = sampling_params(request(temperature=0))
    assert params == {"max_new_tokens": 7, "temperature": 0.0, "top_p": 1.0, "top_k": -1}


def test_sampling_seed_only_when_configured():
    assert sampling_params(request(), send_seed=True)["sampling_seed"] == 12345
    no_seed = GenerationRequest("r", [1], SamplingParams(max_tokens=1), seed=None)
    assert "sampling_seed" not in sampling_params(no_seed, send_seed=True)


def test_generate_body_matches_the_documented_rl_request():
    body = generate_body(request(), "abc")
    assert body == {"input_ids": [11, 12, 13], "rid": "abc", "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 7, "temperature": 1.0, "top_p": 1.0, "top_k": -1}}


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0, stop=("a",)), dict(top_k=3, stop_token_ids=(9,)),
                                      dict(top_logprobs=5)])
@pytest.mark.parametrize("send_seed", [False, True])
def test_fast_body_encoder_is_byte_identical(sampling, send_seed):
    enc = BodyEncoder(send_seed=send_seed, extra_sampling={"min_p": 0.05})
    req = request(**sampling)
    for _ in range(2):  # the second call uses the cached sampling fragment
        expected = encode_json(generate_body(req, "r" * 32, send_seed=send_seed, extra_sampling={"min_p": 0.05}))
        assert enc.encode(req, "r" * 32) == expected


def test_top_logprobs_are_asked_for_only_when_the_request_wants_them():
    assert "top_logprobs_num" not in generate_body(request(), "abc")
    body = generate_body(request(top_logprobs=5), "abc")
    assert body["top_logprobs_num"] == 5 and "top_logprobs" not in body["sampling_params"]


def test_output_top_logprobs_become_one_dict_per_output_token():
    body = json.loads(FINAL_ALL_LOGPROBS)
    body["output_ids"] = [5, 6]
    body["meta_info"]["output_top_logprobs"] = [[[-0.5, 5, None], [-1.25, 9, None]], None]
    result = parse_generate_response(body).check()
    assert result.top_logprobs == [{5: -0.5, 9: -1.25}, {}]  # a null position is an empty dict
    body["meta_info"]["output_top_logprobs"] = [[[None, 5, None]], [[-0.1, 6, "x"]]]
    first, second = parse_generate_response(body).top_logprobs
    assert math.isnan(first[5]) and second == {6: -0.1}
    del body["meta_info"]["output_top_logprobs"]
    assert parse_generate_response(body).top_logprobs is None
    for bad in ([[[-0.5, 5, None]]], [[["x", 5, None]], None], [[[-0.5, "5", None]], None], "oops"):
        body["meta_info"]["output_top_logprobs"] = bad
        with pytest.raises(ProtocolError, match="output_top_logprobs"):
            parse_generate_response(body)


def test_extra_sampling_rejects_unknown_and_managed_keys():
    assert check_extra_sampling({"min_p": 0.1, "repetition_penalty": 1.1}) == {"min_p": 0.1,
                                                                              "repetition_penalty": 1.1}
    with pytest.raises(ValueError, match="unknown SGLang sampling parameter.*'seed'"):
        check_extra_sampling({"seed": 1})
    with pytest.raises(ValueError, match="'max_new_tokens'.*sampling:"):
        check_extra_sampling({"max_new_tokens": 4})


# -- responses: the literal fixtures of sglang-api.md §7.2 -------------------------

NON_FINAL = ('{"text":"ok","meta_info":{"id":"client-rid","prompt_tokens":5,"completion_tokens":2,'
             '"finish_reason":null,"cached_tokens":0,"cached_tokens_details":null,"reasoning_tokens":0,'
             '"num_retractions":0,"dp_rank":null},"output_ids":[7,8]}')
FINAL_ALL_LOGPROBS = (
    '{"text":"ok","meta_info":{"id":"r","prompt_tokens":1,"completion_tokens":1,"finish_reason":{"type":"stop",'
    '"matched":[1,2]},"output_token_logprobs":[[-0.5,5,"x"],[null,6,null]],"input_token_logprobs":[],'
    '"output_top_logprobs":[null,[[-0.25,6,null]]],"input_top_logprobs":[[[-0.125,1,"<s>"]]],'
    '"output_token_ids_logprobs":[[[-0.5,9,null]]],"input_token_ids_logprobs":[null],"hidden_states":[[0.5,0.25],[]],'
    '"e2e_latency":0.01,"cached_tokens":1,"cached_tokens_details":{"device":0,"host":0,"storage":1,'
    '"storage_backend":"test"},"reasoning_tokens":0,"num_retractions":2,"dp_rank":1},"output_ids":[5],"index":0}')
LENGTH = ('{"text":"","meta_info":{"id":"r","prompt_tokens":1,"completion_tokens":9,"finish_reason":{"type":"length",'
          '"length":9},"cached_tokens_details":{"device":0,"host":0},"dp_rank":null}}')
ABORT = ('{"text":"","meta_info":{"id":"r","prompt_tokens":1,"completion_tokens":0,"finish_reason":{"type":"abort",'
         '"message":"over the limit","status_code":400,"err_type":null},"cached_tokens_details":null,'
         '"dp_rank":null}}')
STREAM_ERROR = '{"error":{"message":"bad sampling","code":400},"index":1}'


def test_final_frame_with_every_logprob_family():
    # The fixture's output_ids ([5]) and logprob tuples (ids 5, 6) disagree: a client must not guess.
    with pytest.raises(ProtocolError, match="disagree"):
        parse_generate_response(json.loads(FINAL_ALL_LOGPROBS))
    body = json.loads(FINAL_ALL_LOGPROBS)
    body["output_ids"] = [5, 6]
    result = parse_generate_response(body, expect_rid="r")
    assert result.output_ids == [5, 6]
    assert result.logprobs[0] == -0.5 and math.isnan(result.logprobs[1])  # a null logprob stays visible
    assert result.finish_reason == "stop" and result.text == "ok"
    assert result.meta["matched"] == [1, 2] and result.meta["num_retractions"] == 2
    assert result.meta["null_logprobs"] == 1 and result.meta["cached_tokens"] == 1


def test_ids_come_from_the_logprob_tuples_when_output_ids_is_absent():
    body = json.loads(FINAL_ALL_LOGPROBS)
    del body["output_ids"]
    assert parse_generate_response(body).output_ids == [5, 6]


def test_non_final_frame_is_not_a_result():
    with pytest.raises(ProtocolError, match="non-final"):
        parse_generate_response(json.loads(NON_FINAL))


def test_length_finish_without_logprobs_says_return_logprob_is_needed():
    with pytest.raises(ProtocolError, match="return_logprob"):
        parse_generate_response(json.loads(LENGTH))
    body = json.loads(LENGTH)
    body["output_ids"] = [4] * 9
    body["meta_info"]["output_token_logprobs"] = [[-1.0, 4, None]] * 9
    result = parse_generate_response(body)
    assert result.finish_reason == "length" and len(result.output_ids) == len(result.logprobs) == 9


def test_abort_finish_carries_its_message():
    result = parse_generate_response(json.loads(ABORT))
    assert result.finish_reason == "abort" and result.output_ids == [] and result.logprobs == []
    assert result.meta["message"] == "over the limit" and result.meta["status_code"] == 400
    result.check()


def test_abort_with_partial_output_keeps_only_paired_tokens():
    body = {"output_ids": [3, 4, 5], "meta_info": {"id": "r", "finish_reason": {"type": "abort", "message": "Aborted"},
                                                   "output_token_logprobs": [[-1.0, 3, None], [-2.0, 4, None]]}}
    result = parse_generate_response(body)
    assert result.output_ids == [3, 4] and result.logprobs == [-1.0, -2.0]


def test_stream_error_item_is_not_a_result_and_its_message_is_read():
    with pytest.raises(ProtocolError, match="meta_info"):
        parse_generate_response(json.loads(STREAM_ERROR))
    assert error_message(400, STREAM_ERROR) == "HTTP 400: bad sampling"


def test_weight_version_and_spans_are_kept():
    # sglang-api.md §7.3
    fragment = json.loads('{"weight_version": "42", "weight_versions": [{"version": "41", "start": 0, "end": 57},'
                          ' {"version": "42", "start": 57, "end": 128}]}')
    body = {"output_ids": [9], "meta_info": {"id": "r", "finish_reason": {"type": "stop", "matched": 9},
                                             "output_token_logprobs": [[-0.1, 9, None]], **fragment}}
    result = parse_generate_response(body)
    assert result.weight_version == "42"
    assert result.meta["weight_versions"][1] == {"version": "42", "start": 57, "end": 128}


def test_batch_and_foreign_rid_responses_are_refused():
    one = {"output_ids": [1], "meta_info": {"id": "a", "finish_reason": {"type": "stop"},
                                            "output_token_logprobs": [[-1.0, 1, None]]}}
    with pytest.raises(ProtocolError, match="array"):
        parse_generate_response([one, one])
    with pytest.raises(ProtocolError, match="not 'b'"):
        parse_generate_response(one, expect_rid="b")
    with pytest.raises(ProtocolError, match="unknown finish_reason"):
        parse_generate_response({**one, "meta_info": {**one["meta_info"], "finish_reason": {"type": "eos"}}})


def test_a_constraint_goes_out_as_sglangs_native_grammar_parameter():
    """A forced tool call or JSON output (scaffold-serve) is enforced by SGLang's own grammar backend."""
    from scaffold_core.sampling import Constraint
    from scaffold_sglang.engine import SGLangEngine
    from scaffold_sglang.protocol import BodyEncoder, generate_body

    for kind in ("json_schema", "regex", "ebnf", "structural_tag"):
        sampling = SamplingParams(max_tokens=8, constraint=Constraint(kind, '{"type": "object"}'))
        request = GenerationRequest("r", [1, 2], sampling)
        body = generate_body(request, "r")
        assert body["sampling_params"][kind] == '{"type": "object"}'
        assert json.loads(BodyEncoder().encode(request, "r"))["sampling_params"][kind] == '{"type": "object"}'
        assert kind in SGLangEngine.constraints
    plain = generate_body(GenerationRequest("r", [1], SamplingParams(max_tokens=8)), "r")["sampling_params"]
    assert not {"json_schema", "regex", "ebnf", "structural_tag"} & set(plain)


def _timed(**meta) -> dict:
    """A final response of 5 tokens whose meta_info also holds ``meta``."""
    return {"output_ids": [5, 6, 7, 8, 2], "meta_info": {
        "id": "r", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3, "completion_tokens": 5,
        "output_token_logprobs": [[-0.5, t, None] for t in (5, 6, 7, 8, 2)], **meta}}


def test_a_server_started_with_enable_metrics_gives_the_requests_queue_prefill_and_decode_time():
    from scaffold_remote.engine import SERVER_TIMING

    # --enable-metrics (recent versions): inference_time runs from leaving the queue to the end, and the decode
    # rate counts the tokens after the first over the time from the first token to the last
    result = parse_generate_response(_timed(e2e_latency=2.0, inference_time=1.5, decode_throughput=4.0,
                                            request_received_ts=1.7e9, request_finished_ts=1.7e9 + 2))
    assert result.meta[SERVER_TIMING] == pytest.approx({"queued": 0.5, "prefill": 0.5, "decode": 1.0})
    # versions without inference_time: the time to the first token is queue and prefill together
    result = parse_generate_response(_timed(e2e_latency=2.0, decode_throughput=4.0))
    assert result.meta[SERVER_TIMING] == pytest.approx({"first_token": 1.0, "decode": 1.0})
    # without --enable-metrics (only e2e_latency), a one-token answer, or numbers that make no sense: nothing
    for meta in ({"e2e_latency": 2.0}, {"e2e_latency": 2.0, "decode_throughput": 0}, {"decode_throughput": 4.0},
                 {"e2e_latency": float("nan"), "decode_throughput": 4.0}):
        assert SERVER_TIMING not in parse_generate_response(_timed(**meta)).meta, meta
    one = {"output_ids": [2], "meta_info": {"id": "r", "finish_reason": {"type": "stop"}, "e2e_latency": 1.0,
                                            "decode_throughput": 9.0, "output_token_logprobs": [[-0.1, 2, None]]}}
    assert SERVER_TIMING not in parse_generate_response(one).meta
    # a decode longer than the whole request (a rate from another clock): held within the request
    assert parse_generate_response(_timed(e2e_latency=0.5, decode_throughput=4.0)).meta[SERVER_TIMING] == \
        pytest.approx({"first_token": 0.0, "decode": 0.5})
