"""The vllm engine against the protocol test server, in process (fast, deterministic)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from vllm_testkit import byte_server, engine, free_port, req, run, ts

from scaffold_core.errors import EngineError
from scaffold_core.sampling import derive_seed, mix_seed


def served(server, work, **options):
    """Run ``work(engine)`` against ``server`` served in process; its value."""

    async def main():
        async with ts.running(server) as url:
            async with engine(url, **options) as eng:
                return await work(eng)

    return run(main())


def test_ids_and_logprobs_round_trip_exactly():
    server = byte_server()

    async def work(eng):
        return await asyncio.gather(*(eng.generate(req(i, max_tokens=6)) for i in range(8))), eng

    results, eng = served(server, work)
    sent = {r["rid"]: r for r in server.responses}
    assert len(sent) == 8 and eng.context_length == server.context_length and eng.endpoint == "/inference/v1/generate"
    for result in results:
        record = sent[result.meta["rid"].removeprefix("generate-tokens-")]
        assert result.output_ids == record["output_ids"] and result.logprobs == record["logprobs"]
        assert result.finish_reason == record["finish_reason"]
        assert result.weight_version == 0 and result.versions is None
        assert result.text == server.decode(result.output_ids, skip_special_tokens=True)  # decoded here
        if result.finish_reason == "stop":
            assert result.output_ids[-1] == 2  # the matched EOS stays in the output ids


def test_top_logprobs_round_trip_when_asked():
    server = byte_server(backend_options={"mean_tokens": 10_000})

    async def work(eng):
        return await eng.generate(req(1, max_tokens=5, top_logprobs=3))

    result = served(server, work)
    assert len(result.top_logprobs) == len(result.output_ids) == 5
    for position, token, logprob in zip(result.top_logprobs, result.output_ids, result.logprobs):
        assert position[token] == logprob and len(position) == 3  # the sampled token first, then alternatives


def test_every_sampling_field_reaches_the_wire_and_nothing_is_dropped():
    server = byte_server()

    async def work(eng):
        await eng.generate(req(1, max_tokens=5, temperature=0.8, top_p=0.9, top_k=20, stop_token_ids=(7,),
                               stop=("zz",), seed=99))

    served(server, work, sampling_extra={"min_p": 0.05, "repetition_penalty": 1.1})
    (body,) = server.bodies
    assert body["sampling_params"] == {"max_tokens": 5, "temperature": 0.8, "top_p": 0.9, "top_k": 20,
                                       "logprobs": 0, "seed": 99, "stop": ["zz"], "stop_token_ids": [7],
                                       "min_p": 0.05, "repetition_penalty": 1.1}
    assert server.ignored_fields == []  # vLLM would have dropped an unknown key without a word


def test_max_tokens_is_always_sent_so_vllms_16_token_default_never_applies():
    server = byte_server(backend_options={"mean_tokens": 10_000})

    async def work(eng):
        return await eng.generate(req(1, max_tokens=40))

    result = served(server, work)
    assert len(result.output_ids) == 40 and result.finish_reason == "length"  # the server's default would give 16
    assert server.bodies[0]["sampling_params"]["max_tokens"] == 40


def test_each_request_carries_its_own_seed_from_the_run_seed_and_the_sample():
    """Through the runtime: seeds derived from the run's seed, the episode and the sample; same seed, same tokens."""
    from scaffold_testkit import ListTask, make_contexts

    from scaffold_core.builtins.controllers import NativeController
    from scaffold_core.run.assembly import Limits
    from scaffold_core.run.runtime import Runtime
    from scaffold_core.sampling import SamplingParams

    def rollout(run_seed: int):
        server = byte_server(backend_options={"mean_tokens": 12})

        async def work(eng):
            task = ListTask([{"id": f"q{i}", "question": f"{i}?", "answer": "1"} for i in range(3)])
            contexts = make_contexts(task, eng.tokenizer, SamplingParams(max_tokens=12, temperature=1.0,
                                                                         seed=run_seed))
            results = []
            await Runtime(engine=eng, controller=NativeController(samples=2), verifier=None,
                          limits=Limits(concurrency=6)).run(contexts, results.append)
            return {r.episode_id: [s.output_ids for s in r.samples] for r in results}

        tokens = served(server, work)
        seeds = sorted(b["sampling_params"]["seed"] for b in server.bodies)
        return tokens, seeds

    tokens, seeds = rollout(7)
    again, seeds_again = rollout(7)
    other, other_seeds = rollout(8)
    expected = sorted(mix_seed(derive_seed(7, f"q{i}"), sample, 1) for i in range(3) for sample in range(2))
    assert seeds == expected and len(set(seeds)) == 6  # one per episode and sample, from the run's seed
    assert tokens == again and seeds_again == seeds  # reproducible
    assert other != tokens and not set(other_seeds) & set(seeds)


@pytest.mark.parametrize("status", [503, 500, 502, 429])
def test_5xx_answers_are_retried_inside_the_engine_without_a_second_result(status):
    server = byte_server(fail_first=2, fail_status=status)

    async def work(eng):
        return await eng.generate(req(1, max_tokens=4)), eng.stats()

    result, stats = served(server, work)
    assert result.meta["attempts"] == 3 and stats["retries"] == 2 and stats["http_errors"] == 2
    assert len(server.responses) == 1 and server.requests_seen == 3  # generated once


def test_a_dropped_connection_is_retried_and_the_sample_is_generated_once():
    server = byte_server(drop_first=1)

    async def work(eng):
        return await eng.generate(req(1, max_tokens=4, temperature=1.0, seed=5)), eng.stats()

    result, stats = served(server, work)
    assert result.meta["attempts"] == 2 and stats["connection_errors"] == 1 and server.dropped == 1
    assert len(server.responses) == 1 and result.output_ids == server.responses[0]["output_ids"]
    first, second = server.bodies
    assert first["request_id"] != second["request_id"]  # a fresh id per attempt (vLLM refuses a live duplicate)
    assert first["sampling_params"] == second["sampling_params"]  # the same seed: the retry samples the same


def test_retries_are_bounded_and_the_error_is_retryable_for_the_runtime():
    server = byte_server(fail_first=100)

    async def work(eng):
        with pytest.raises(EngineError) as info:
            await eng.generate(req(1))
        return info.value

    error = served(server, work, max_retries=2)
    assert error.retryable and "failed after 3 attempt(s)" in str(error) and "injected failure" in str(error)


def test_a_refused_request_is_not_retried_and_says_what_to_do():
    server = byte_server(context_length=64)

    async def work(eng):
        with pytest.raises(EngineError) as info:
            await eng.generate(req(1, max_tokens=100))
        return info.value

    error = served(server, work)
    assert not error.retryable and server.requests_seen == 1
    assert "maximum context length is 64 tokens" in str(error) and "--max-model-len" in str(error)


def test_connection_refused_is_retried_until_the_server_is_back():
    port = free_port()
    server = byte_server()

    async def main():
        async with ts.running(byte_server(), port=port) as url:
            eng = engine(url, retry_backoff=0.2, max_retries=6)
            await eng.start()
        try:  # the server is gone: the request waits for it, through the retries
            pending = asyncio.ensure_future(eng.generate(req(1, max_tokens=3)))
            await asyncio.sleep(0.3)
            async with ts.running(server, port=port):
                result = await pending
            return result, eng.stats()
        finally:
            await eng.close()

    result, stats = run(main())
    assert result.output_ids and stats["connection_errors"] >= 1 and len(server.responses) == 1


def test_servers_without_the_generate_endpoint_get_completions_with_token_ids():
    server = byte_server(generate_endpoint=False, served_model_name="policy")

    async def work(eng):
        return await eng.generate(req(1, max_tokens=6, top_logprobs=2)), eng.endpoint

    result, endpoint = served(server, work)
    (body,) = server.bodies
    assert endpoint == "/v1/completions" and body["model"] == "policy" and body["prompt"] == req(1).prompt_ids
    assert body["return_tokens_as_token_ids"] is True and body["max_tokens"] == 6 and server.ignored_fields == []
    record = server.responses[0]
    assert result.output_ids == record["output_ids"] and result.logprobs == record["logprobs"]
    assert all(len(position) == 2 for position in result.top_logprobs)


def test_an_older_server_that_sends_token_id_strings_but_no_token_ids_still_round_trips():
    server = byte_server(generate_endpoint=False, return_token_ids=False)

    async def work(eng):
        return await eng.generate(req(1, max_tokens=6))

    result = served(server, work)
    assert result.output_ids == server.responses[0]["output_ids"]
    assert server.ignored_fields == ["return_token_ids"]  # it ignores the field; the strings carry the ids


def test_a_server_flag_that_makes_every_token_an_id_string_is_understood():
    """``--return-tokens-as-token-ids`` on the server: tokens are ``token_id:<id>`` whatever the request says."""
    server = byte_server(generate_endpoint=False, return_token_ids=False, tokens_as_ids=True)

    async def work(eng):
        return await eng.generate(req(3, max_tokens=6, top_logprobs=1))

    result = served(server, work)
    assert result.output_ids == server.responses[0]["output_ids"] and result.top_logprobs


def test_api_key_is_sent_as_bearer_from_the_environment_and_never_shown(monkeypatch, caplog):
    monkeypatch.setenv("VLLM_API_KEY", "sekret-key-123")
    server = byte_server(api_key="sekret-key-123")

    async def work(eng):
        await eng.generate(req(1))
        await eng.pause_generation("keep")
        await eng.continue_generation()

    with caplog.at_level(logging.DEBUG):
        served(server, work)
    assert {h for _, h in server.auth_headers} == {"Bearer sekret-key-123"}
    assert {p for p, _ in server.auth_headers} >= {"/v1/models", "/inference/v1/generate", "/pause", "/resume"}
    assert "sekret-key-123" not in caplog.text

    wrong = byte_server(api_key="another")
    with pytest.raises(EngineError, match="needs an API key.*VLLM_API_KEY"):
        served(wrong, lambda eng: eng.generate(req(1)))


def test_pause_without_the_development_routes_names_the_fix():
    server = byte_server(dev_mode=False)

    async def work(eng):
        with pytest.raises(EngineError) as info:
            await eng.pause_generation()
        return info.value, eng.paused_mode

    error, mode = served(server, work)
    assert "HTTP 404" in str(error) and "VLLM_SERVER_DEV_MODE=1" in str(error) and mode is None


def test_several_servers_least_loaded_and_one_episode_per_server():
    servers = [byte_server(backend_options={"token_delay_s": 0.002}) for _ in range(3)]

    async def main():
        async with ts.running(servers[0]) as a, ts.running(servers[1]) as b, ts.running(servers[2]) as c:
            async with engine([a, b, c]) as eng:
                results = await asyncio.gather(*(eng.generate(req(i % 6, max_tokens=4)) for i in range(30)))
                return results, eng.stats()

    results, stats = run(main())
    by_episode: dict[str, set[str]] = {}
    for i, result in enumerate(results):
        by_episode.setdefault(f"ep-{i % 6}", set()).add(result.meta["server"])
    assert all(len(urls) == 1 for urls in by_episode.values())  # an episode sticks to one server
    assert all(s.responses for s in servers) and sum(v["requests"] for v in stats["servers"].values()) == 30


def test_options_are_validated_before_anything_starts():
    from scaffold_vllm import VLLMEngine

    from scaffold_core.errors import ConfigError
    from scaffold_core.plugins.options import validate_options

    for options, message in (({"api": "chat"}, "engine.api: Input should be 'auto', 'generate' or 'completions'"),
                             ({"weight_sync": "nfs"}, "engine.weight_sync: Input should be 'rpc' or 'transfer'"),
                             ({"pause_mode": "freeze"}, "engine.pause_mode: Input should be 'abort', 'keep' or 'wait'"),
                             ({"request_timeout": 0}, r"engine.request_timeout: Input should be greater than 0; got 0"),
                             ({"max_retries": -1}, "engine.max_retries: Input should be greater than or equal to 0")):
        with pytest.raises(ConfigError, match=message):
            validate_options(VLLMEngine, options, path="engine", label="engine 'vllm'")
    for options, message in (({"url": "http://::1:8000"}, r"http://\[addr\]:port"),
                             ({"sampling_extra": {"bogus": 1}}, "not a sampling field"),
                             ({"api": "completions", "sampling_extra": {"bad_words": ["x"]}}, "/v1/completions"),
                             ({"url": "http://a:1", "launch": {"model_path": "m"}}, "not both"),
                             ({"launch": {"model_path": "m", "extra_args": ["--port", "1"]}}, "--port is set by")):
        with pytest.raises(ValueError, match=message):
            VLLMEngine(**options)
