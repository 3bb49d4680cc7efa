"""The engine contract's weight update on SGLang (``update_weights`` -> ``/update_weights_from_disk``)
against the protocol test server: versions, in-flight requests, errors."""

from __future__ import annotations

import asyncio

import pytest
from sglang_testkit import byte_server, run, ts
from test_client import engine, req

from scaffold_core.errors import EngineError
from scaffold_core.spans import recording
from scaffold_core.trajectory import version_number


def test_update_weights_loads_the_checkpoint_and_moves_the_version(tmp_path):
    server = byte_server()
    checkpoint = tmp_path / "step-3"
    checkpoint.mkdir()

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                before = await eng.generate(req(1))
                first = await eng.update_weights(checkpoint)
                second = await eng.update_weights(str(checkpoint), version=7)
                after = await eng.generate(req(1))
                return eng.weight_version, before, first, second, after

    current, before, first, second, after = run(main())
    assert (first, second, current) == (1, 7, 7)
    assert version_number(before.weight_version) == 0 and after.weight_version == "7"
    sent = [body for name, body in server.control_log if name == "update_weights_from_disk"]
    assert sent == [{"model_path": str(checkpoint), "abort_all_requests": False, "flush_cache": True,
                     "weight_version": "1"},
                    {"model_path": str(checkpoint), "abort_all_requests": False, "flush_cache": True,
                     "weight_version": "7"}]
    assert server.model_path == str(checkpoint)


def test_a_failed_update_keeps_the_old_version():
    server = byte_server()

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                errors = []
                for source, kwargs in (("/no/such/checkpoint", {}), (None, {}), (server.model_path, {"version": -1})):
                    with pytest.raises(EngineError) as info:
                        await eng.update_weights(source, **kwargs)
                    errors.append(str(info.value))
                return eng.weight_version, errors

    version, errors = run(main())
    assert version == 0
    assert "Failed to get weights iterator" in errors[0]
    assert "checkpoint directory" in errors[1] and "never go backwards" in errors[2]


def update_mid_request(tmp_path, pause_mode: str, compat: str = "0.5.23", spans: list | None = None):
    """One 40-token request (10 ms a token) with a weight update 0.12 s into it; (result, server, engine stats).
    ``spans``: the request's span list, as an episode's (``scaffold_core.spans``)."""
    server = byte_server(compat=compat, backend_options={"token_delay_s": 0.01, "mean_tokens": 10_000})

    async def main():
        async with ts.running(server) as url:
            async with engine(url, pause_mode=pause_mode) as eng:
                async def long_request():
                    with recording(spans):
                        return await eng.generate(req(1, max_tokens=40))

                running = asyncio.ensure_future(long_request())
                while not server.live:
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.12)
                assert await eng.update_weights(str(tmp_path)) == 1
                done_at_update = running.done()
                later = await eng.generate(req(2, max_tokens=4))
                return await running, later, done_at_update, eng.stats()

    result, later, done_at_update, stats = run(main())
    assert later.weight_version == "1" and later.versions is None
    server.responses = [r for r in server.responses if r["max_tokens"] != 4]  # the long request's parts only
    return result, server, done_at_update, stats


def test_pause_abort_continues_the_request_and_each_token_has_the_version_that_sampled_it(tmp_path):
    spans: list = []
    result, server, done_at_update, stats = update_mid_request(tmp_path, "abort", spans=spans)
    first, rest = server.responses[0], server.responses[1]
    assert first["finish_reason"] == "abort" and rest["input_ids"] == first["input_ids"] + first["output_ids"]
    assert result.output_ids == first["output_ids"] + rest["output_ids"] and len(result.output_ids) == 40
    assert result.logprobs == first["logprobs"] + rest["logprobs"] and result.finish_reason == "length"
    truth = [version_number(label) for label in first["labels"] + rest["labels"]]  # what the server sampled with
    assert result.versions == truth and truth[0] == 0 and truth[-1] == 1
    assert result.weight_version == 0 and stats["continued"] == 1 and not done_at_update
    assert [name for name, _ in server.control_log] == ["pause_generation", "update_weights_from_disk",
                                                        "continue_generation"]
    (wait,) = spans  # the episode's timeline shows the wait for the new weights
    assert wait[0] == "weight_wait" and wait[2] > wait[1]


def test_pause_keep_retracts_and_the_servers_spans_give_each_tokens_version(tmp_path):
    result, server, done_at_update, stats = update_mid_request(tmp_path, "keep")
    (record,) = server.responses
    assert record["finish_reason"] == "length"  # one request, kept, not aborted
    assert result.output_ids == record["output_ids"] and result.meta["num_retractions"] > 0
    truth = [version_number(label) for label in record["labels"]]
    assert result.versions == truth and truth[0] == 0 and truth[-1] == 1 and stats["continued"] == 0
    assert server.control_log[0] == ("pause_generation", {"mode": "retract"})
    assert server.control_log[1][1]["flush_cache"] is False  # the kept requests' cache stays


def test_pause_keep_without_spans_says_the_older_version_and_that_it_is_not_exact(tmp_path):
    result, server, _, stats = update_mid_request(tmp_path, "keep", compat="0.5.8")
    assert {label for label in server.responses[0]["labels"]} == {"default", "1"}  # it did cross the update
    assert result.versions is None and result.weight_version == 0  # conservative: staleness counts from v0
    assert result.meta["versions_exact"] is False and stats["inexact_versions"] == 1


def test_pause_wait_lets_requests_in_flight_finish_on_the_old_weights(tmp_path):
    result, server, done_at_update, _ = update_mid_request(tmp_path, "wait")
    assert done_at_update  # the update waited for the running request
    assert set(server.responses[0]["labels"]) == {"default"} and len(result.output_ids) == 40
    assert version_number(result.weight_version) == 0 and result.versions is None
    assert [name for name, _ in server.control_log] == ["update_weights_from_disk"]
