"""The sglang engine against the protocol test server, in process (fast, deterministic)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sglang_testkit import byte_server, free_port, run, ts

from scaffold_core.errors import ConfigError, EngineError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_sglang import SGLangEngine


def req(i: int | str = 0, *, prompt=None, episode: str | None = None, **sampling) -> GenerationRequest:
    sp = SamplingParams(**{"max_tokens": 16, "temperature": 0.0, **sampling})
    return GenerationRequest(f"req-{i}", prompt or [40 + sum(map(ord, str(i))) % 50, 41, 42], sp,
                             episode_id=episode or f"ep-{i}")


def engine(url, **kw) -> SGLangEngine:
    kw.setdefault("tokenizer", "builtin:byte")
    kw.setdefault("retry_backoff", 0.01)
    return SGLangEngine(url=url, **kw)


def test_results_are_the_servers_tokens_and_logprobs():
    server = byte_server()

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                results = await asyncio.gather(*(eng.generate(req(i, max_tokens=6)) for i in range(8)))
                return results, eng.context_length

    results, context = run(main())
    sent = {r["rid"]: r for r in server.responses}
    assert len(sent) == 8 and context == server.context_length
    for result in results:
        record = sent[result.meta["rid"]]
        assert result.output_ids == record["output_ids"] and result.logprobs == record["logprobs"]
        assert result.finish_reason == record["finish_reason"] in ("stop", "length")
        assert len(result.output_ids) <= 6 and result.weight_version == "default"
        if result.finish_reason == "stop":
            assert result.output_ids[-1] == 2  # the matched EOS stays in the output ids


def test_the_request_sent_is_explicit_and_known_to_sglang():
    server = byte_server()
    seen: list[dict] = []
    orig = server._check_sampling

    def spy(params):
        seen.append(dict(params))
        return orig(params)

    server._check_sampling = spy

    async def main():
        async with ts.running(server) as url:
            async with engine(url, sampling_extra={"min_p": 0.05}) as eng:
                await eng.generate(req(1, max_tokens=5, temperature=0.8, top_p=0.9, top_k=20,
                                       stop_token_ids=(7,), stop=("zz",)))

    run(main())
    assert seen == [{"max_new_tokens": 5, "temperature": 0.8, "top_p": 0.9, "top_k": 20, "stop": ["zz"],
                     "stop_token_ids": [7], "min_p": 0.05}]


def test_stop_token_ids_end_generation_at_the_matched_token():
    server = byte_server(backend_options={"mean_tokens": 40})

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                free = await eng.generate(req(3, max_tokens=30))
                stop_at = free.output_ids[4]
                stopped = await eng.generate(req(3, max_tokens=30, stop_token_ids=(stop_at,)))
                return free, stopped, stop_at

    free, stopped, stop_at = run(main())
    first = free.output_ids.index(stop_at)
    assert stopped.output_ids == free.output_ids[: first + 1] and stopped.finish_reason == "stop"
    assert stopped.meta["matched"] == stop_at


def test_text_is_decoded_locally_when_the_server_sends_none_and_cut_at_stop_strings():
    server = byte_server(backend_options={"mean_tokens": 40}, skip_tokenizer_init=True)  # no text in responses

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                for i in range(20):  # a response long enough to hold a stop string in its middle
                    plain = await eng.generate(req(i, max_tokens=12))
                    text = eng.tokenizer.decode(plain.output_ids, skip_special_tokens=True)
                    if len(text) >= 8:
                        break
                stop = text[3:5]
                cut = await eng.generate(req(i, max_tokens=12, stop=(stop,)))
                return plain, text, stop, cut

    plain, text, stop, cut = run(main())
    assert plain.text == text and len(text) >= 8
    assert cut.text == text[: text.find(stop)] and cut.output_ids == plain.output_ids


def test_the_servers_text_is_used_and_its_stop_strings_end_generation():
    server = byte_server(backend_options={"mean_tokens": 40})

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                for i in range(20):
                    plain = await eng.generate(req(i, max_tokens=16))
                    if len(plain.text) >= 10:
                        break
                stop = plain.text[5:7]
                cut = await eng.generate(req(i, max_tokens=16, stop=(stop,)))
                return plain, stop, cut

    plain, stop, cut = run(main())
    at = plain.text.find(stop)
    assert cut.finish_reason == "stop" and cut.meta["matched"] == stop and cut.text == plain.text[:at]
    assert cut.output_ids == plain.output_ids[: len(cut.output_ids)] and len(cut.output_ids) < len(plain.output_ids)


def test_tokenizer_null_falls_back_to_the_servers_tokenizer_path():
    async def main():
        async with ts.running(byte_server(tokenizer_path="builtin:byte")) as url:
            async with SGLangEngine(url=url) as eng:
                return type(eng.tokenizer).__name__, eng.model_info["tokenizer_path"]

    assert run(main()) == ("ByteTokenizer", "builtin:byte")


def test_server_errors_are_not_retried_and_name_the_problem():
    server = byte_server(context_length=10)

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                with pytest.raises(EngineError) as info:
                    await eng.generate(req(1, max_tokens=50))
                return info.value, server.requests_seen

    error, seen = run(main())
    assert not error.retryable and seen == 1
    assert "maximum context length of 10 tokens" in str(error)


@pytest.mark.parametrize("status", [503, 500, 502])
def test_5xx_answers_are_retried_with_backoff(status):
    server = byte_server(fail_first=2, fail_status=status)

    async def main():
        async with ts.running(server) as url:
            async with engine(url, max_retries=3) as eng:
                result = await eng.generate(req(1))
                return result, eng.stats()

    result, stats = run(main())
    assert result.meta["attempts"] == 3 and stats["retries"] == 2 and stats["http_errors"] == 2
    assert len({r["rid"] for r in server.responses}) == 1


def test_retries_are_bounded_and_the_error_is_retryable_for_the_runtime():
    server = byte_server(fail_first=100, fail_status=503)

    async def main():
        async with ts.running(server) as url:
            async with engine(url, max_retries=2) as eng:
                with pytest.raises(EngineError) as info:
                    await eng.generate(req(1))
                return info.value

    error = run(main())
    assert error.retryable and "after 3 attempt(s)" in str(error) and "injected failure" in str(error)
    assert server.requests_seen == 3


def test_connection_refused_is_retried_until_the_server_is_back():
    port = free_port()
    server = byte_server()

    async def main():
        # Connect to a server that is up, then take it down and bring it back on the same port.
        runner = ts.running(server, port=port)
        url = await runner.__aenter__()
        eng = engine(url, max_retries=6, retry_backoff=0.1)
        await eng.start()
        try:
            await runner.__aexit__(None, None, None)
            pending = asyncio.ensure_future(eng.generate(req(1)))
            await asyncio.sleep(0.3)
            assert not pending.done()
            runner = ts.running(byte_server(), port=port)
            await runner.__aenter__()
            result = await pending
            return result, eng.stats()
        finally:
            await eng.close()
            await runner.__aexit__(None, None, None)

    result, stats = run(main())
    assert result.finish_reason in ("stop", "length") and stats["connection_errors"] >= 1
    assert result.meta["attempts"] >= 2


def test_a_request_that_hangs_times_out_as_a_retryable_error():
    server = byte_server(backend_options={"token_delay_s": 5.0})

    async def main():
        async with ts.running(server) as url:
            async with engine(url, request_timeout=0.3) as eng:
                with pytest.raises(EngineError) as info:
                    await eng.generate(req(1))
                return info.value

    error = run(main())
    assert error.retryable and "did not answer" in str(error) and "request_timeout" in str(error)


def test_api_key_is_sent_as_bearer_from_the_environment_and_never_shown(monkeypatch, caplog):
    server = byte_server(api_key="s3cret-key")
    monkeypatch.setenv("SGLANG_API_KEY", "s3cret-key")
    caplog.set_level(logging.DEBUG, logger="scaffold")

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                ok = await eng.generate(req(1))
                server.api_key = "rotated-key"  # the key changes under a running client
                with pytest.raises(EngineError) as rotated:
                    await eng.generate(req(2))
                assert not rotated.value.retryable and "HTTP 401" in str(rotated.value)
                assert [p for p, _ in server.auth_headers].count("/generate") == 2  # a 401 is not retried
            monkeypatch.setenv("MY_KEY", "wrong-key")
            with pytest.raises(EngineError) as info:  # refused at start, on /model_info
                await engine(url, api_key_env="MY_KEY").start()
            return ok, info.value

    ok, error = run(main())
    assert ok.output_ids and {h for _, h in server.auth_headers[:3]} == {"Bearer s3cret-key"}
    assert "401" in str(error) and "api_key_env" in str(error)
    assert "s3cret-key" not in str(error) and "wrong-key" not in str(error)
    assert "s3cret-key" not in caplog.text and "wrong-key" not in caplog.text


def test_a_named_api_key_variable_that_is_unset_is_a_config_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)

    async def main():
        async with ts.running(byte_server()) as url:
            with pytest.raises(ConfigError, match="NO_SUCH_KEY_VAR"):
                await engine(url, api_key_env="NO_SUCH_KEY_VAR").start()

    run(main())


def test_abort_comes_back_as_an_abort_result():
    server = byte_server(backend_options={"token_delay_s": 0.02, "mean_tokens": 200})

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                pending = [asyncio.ensure_future(eng.generate(req(i, max_tokens=300))) for i in range(3)]
                while len(server.live) < 3:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
                await eng.abort_all()
                return await asyncio.gather(*pending), eng.stats()

    results, stats = run(main())
    assert [r.finish_reason for r in results] == ["abort"] * 3 and stats["aborted"] == 3
    for r in results:
        assert r.meta["message"] == "Aborted" and len(r.output_ids) == len(r.logprobs) > 0


def test_pause_retract_holds_new_requests_and_continue_finishes_everything():
    server = byte_server(backend_options={"token_delay_s": 0.01, "mean_tokens": 30})

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                running = [asyncio.ensure_future(eng.generate(req(i, max_tokens=40))) for i in range(2)]
                while len(server.live) < 2:
                    await asyncio.sleep(0.01)
                await eng.pause_generation("retract")
                seen = server.requests_seen
                later = asyncio.ensure_future(eng.generate(req(9, max_tokens=5)))
                await asyncio.sleep(0.2)
                held = (not later.done(), server.requests_seen == seen, all(not r.done() for r in running))
                await eng.continue_generation()
                return held, await asyncio.gather(*running, later)

    held, results = run(main())
    assert held == (True, True, True)
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert any(r.meta.get("num_retractions", 0) > 0 for r in results[:2])
    assert [c[1] for c in server.control_log] == [{"mode": "retract"}, {}]


def test_weight_update_flush_and_errors():
    server = byte_server()

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                before = await eng.generate(req(1))
                answers = await eng.update_weights_from_disk(server.model_path, weight_version=7)
                after = await eng.generate(req(1))
                with pytest.raises(EngineError) as missing:
                    await eng.update_weights_from_disk("/no/such/checkpoint")
                await eng.flush_cache()
                return before, answers, after, missing.value

    before, answers, after, missing = run(main())
    assert before.weight_version == "default" and after.weight_version == "7"
    assert answers[0]["success"] is True
    assert "Failed to get weights iterator: /no/such/checkpoint" in str(missing)
    assert ("update_weights_from_disk", {"model_path": server.model_path, "abort_all_requests": False,
                                         "flush_cache": True, "weight_version": "7"}) in server.control_log


def test_flush_cache_refused_while_requests_run():
    server = byte_server(backend_options={"token_delay_s": 0.02, "mean_tokens": 100})

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                pending = asyncio.ensure_future(eng.generate(req(1, max_tokens=100)))
                while not server.live:
                    await asyncio.sleep(0.01)
                with pytest.raises(EngineError, match="running or queued"):
                    await eng.flush_cache()
                await eng.abort_all()
                await pending

    run(main())


def test_several_servers_least_loaded_and_one_episode_per_server():
    servers = [byte_server(backend_options={"token_delay_s": 0.002}) for _ in range(3)]

    async def main():
        async with ts.running(servers[0]) as u0, ts.running(servers[1]) as u1, ts.running(servers[2]) as u2:
            async with engine([u0, u1, u2]) as eng:
                reqs = [req(f"{e}-{k}", episode=f"ep-{e}", max_tokens=8) for e in range(24) for k in range(4)]
                results = await asyncio.gather(*(eng.generate(r) for r in reqs))
                return reqs, results, eng.stats()

    reqs, results, stats = run(main())
    by_episode: dict[str, set[str]] = {}
    for r, result in zip(reqs, results):
        by_episode.setdefault(r.episode_id, set()).add(result.meta["server"])
    assert all(len(s) == 1 for s in by_episode.values())  # prefix caching: an episode stays on one server
    counts = [len(s.responses) for s in servers]
    assert sum(counts) == 96 and min(counts) >= 16, counts  # balanced (least in flight), not all on one


def test_a_dead_server_moves_its_episodes_to_the_others():
    a, b = byte_server(), byte_server()

    async def main():
        async with ts.running(b) as ub:
            runner = ts.running(a)
            ua = await runner.__aenter__()
            async with engine([ua, ub], max_retries=3) as eng:
                first = await asyncio.gather(*(eng.generate(req(i, episode=f"ep-{i}")) for i in range(6)))
                await runner.__aexit__(None, None, None)
                second = await asyncio.gather(*(eng.generate(req(i, episode=f"ep-{i}")) for i in range(6)))
                return ua, ub, first, second

    ua, ub, first, second = run(main())
    assert {r.meta["server"] for r in first} == {ua, ub}
    assert {r.meta["server"] for r in second} == {ub}


def test_options_are_validated_before_anything_starts():
    assert SGLangEngine().urls == ["http://127.0.0.1:30000"]  # SGLang's default address
    with pytest.raises(ValueError, match="not both"):
        SGLangEngine(url="http://a:1", launch={"model_path": "m"})
    with pytest.raises(ValueError, match=r"\[addr\]:port"):
        SGLangEngine(url="::1:30000")
    with pytest.raises(ValueError, match="unknown SGLang sampling parameter"):
        SGLangEngine(url="http://a:1", sampling_extra={"seed": 3})
    with pytest.raises(ValueError, match="engine.launch.count"):
        SGLangEngine(launch={"model_path": "m", "count": 0})
    with pytest.raises(ValueError, match="--port is set by scaffold"):
        SGLangEngine(launch={"model_path": "m", "extra_args": ["--port", "1"]})
    with pytest.raises(ValueError, match="engine.launch.gpus: unknown key"):
        SGLangEngine(launch={"model_path": "m", "gpus": 2})


def test_config_errors_name_the_key_through_the_yaml_path():
    from scaffold_testkit import plugin_set

    import scaffold_sglang
    from scaffold_core.config import load_config

    data = {"task": {"name": "t"}, "engine": {"name": "sglang", "url": "http://a:1", "max_retriess": 2}}

    from scaffold_testkit import ListTask

    from scaffold_core import hookimpl

    class TaskPlugin:
        @hookimpl
        def register_tasks(self, registry):
            registry.add("t", ListTask)

    registry = plugin_set(scaffold_sglang, TaskPlugin()).registry
    with pytest.raises(ConfigError, match="engine.max_retriess: unknown option.*Did you mean 'max_retries'"):
        load_config(data=data, registry=registry)


def test_not_started_engine_says_so():
    eng = SGLangEngine(url="http://127.0.0.1:9")

    async def main():
        with pytest.raises(EngineError, match="not started"):
            await eng.generate(req(1))
        await eng.close()  # safe without start

    run(main())


def test_unreachable_url_fails_start_within_url_wait_timeout():
    port = free_port()

    async def main():
        eng = engine(f"http://127.0.0.1:{port}", url_wait_timeout=0.5)
        with pytest.raises(EngineError, match="not ready within engine.url_wait_timeout=0.5 s"):
            await eng.start()

    run(main())



def test_requests_a_pause_aborts_are_continued_by_the_engine_and_each_episode_runs_once():
    from scaffold_testkit import ListTask, make_contexts

    from scaffold_core.builtins.controllers import NativeController
    from scaffold_core.run.assembly import Limits
    from scaffold_core.run.runtime import Runtime

    # Greedy, with a natural length far above max_tokens: each request runs its 40 tokens (0.8 s), so every
    # one is still decoding when the pause comes (a sampled request could end after a few tokens, before it).
    server = byte_server(backend_options={"token_delay_s": 0.02, "mean_tokens": 1000})

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                task = ListTask([{"id": f"q{i}", "question": f"{i}?", "answer": "1"} for i in range(4)])
                contexts = make_contexts(task, eng.tokenizer, SamplingParams(max_tokens=40, temperature=0.0))
                results = []
                runtime = Runtime(engine=eng, controller=NativeController(), verifier=None,
                                  limits=Limits(retries=1, concurrency=4))
                run_task = asyncio.ensure_future(runtime.run(contexts, results.append))
                while len(server.live) < 4:
                    await asyncio.sleep(0.01)
                await eng.pause_generation("abort")  # in-flight requests end as aborted, partial
                await asyncio.sleep(0.1)
                await eng.continue_generation()
                await run_task
                return results, eng.stats()

    results, stats = run(main())
    assert stats["aborted"] == 4 and stats["continued"] == 4
    assert sorted(r.episode_id for r in results) == ["q0", "q1", "q2", "q3"]
    assert all(r.status == "ok" and r.attempts == 1 for r in results)  # the runtime never saw the abort
    aborted = [r for r in server.responses if r["finish_reason"] == "abort"]
    assert len(aborted) == 4 and len(server.responses) == 8
    for part in aborted:
        rest = next(r for r in server.responses
                    if r is not part and r["input_ids"] == part["input_ids"] + part["output_ids"])
        assert rest["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("enable_metrics", [True, False])
def test_a_request_is_split_into_queue_prefill_and_decode_when_the_server_times_it(enable_metrics):
    """With --enable-metrics the server says how long its parts of a request took: the request's spans are
    queued, prefill and decode, back to back within it; without, the runtime keeps one generate span."""
    from scaffold_core.spans import META_KEY, clock

    server = byte_server(enable_metrics=enable_metrics, backend_options={"token_delay_s": 0.01, "mean_tokens": 400})

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                began = clock()
                result = await eng.generate(req(1, max_tokens=8))
                return result, began, clock()

    result, began, ended = run(main())
    if not enable_metrics:
        assert META_KEY not in result.meta
        return
    spans = result.meta[META_KEY]
    assert [s[0] for s in spans] == ["queued", "prefill", "decode"]
    assert began <= spans[0][1] and spans[-1][2] <= ended
    assert all(a[2] == b[1] for a, b in zip(spans, spans[1:]))  # back to back, ending with the answer
    assert len(result.output_ids) == 8  # the decode rate needs two tokens or more
    decode = spans[2][2] - spans[2][1]
    assert decode == pytest.approx(result.meta["server_timing"]["decode"])
    assert decode > 0 and spans[1][2] - spans[1][1] > 0  # the first token's time is prefill here
