"""The engine contract's weight update on SGLang (``update_weights`` -> ``/update_weights_from_disk``)
against the protocol test server: versions, in-flight requests, errors."""

from __future__ import annotations

import asyncio

import pytest
from sglang_testkit import byte_server, run, ts
from test_client import engine, req

from scaffold_core.errors import EngineError
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


def test_requests_in_flight_finish_on_the_old_weights(tmp_path):
    server = byte_server(backend_options={"token_delay_s": 0.01, "mean_tokens": 60})

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                running = asyncio.ensure_future(eng.generate(req(1, max_tokens=40)))
                while not server.live:
                    await asyncio.sleep(0.005)
                version = await eng.update_weights(str(tmp_path))
                done_first = running.done()
                later = await eng.generate(req(2, max_tokens=4))
                return version, done_first, await running, later

    version, done_first, in_flight, later = run(main())
    assert version == 1 and done_first  # the update waited for the running request
    assert version_number(in_flight.weight_version) == 0 and len(in_flight.output_ids) > 1
    assert later.weight_version == "1"
