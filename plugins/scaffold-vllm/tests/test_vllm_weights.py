"""Weight updates and partial rollouts on vLLM: from disk (worker extension, or the weight-transfer API), through
the weight-transfer API (NCCL/IPC chunks), mid-generation, with each token's version checked against the weights
the test server really sampled it with."""

from __future__ import annotations

import asyncio

import pytest
from vllm_testkit import byte_server, engine, req, run, ts

from scaffold_core.errors import EngineError
from scaffold_core.train.staleness import is_stale, oldest_version


def update_mid_request(tmp_path, pause_mode: str, **server_options):
    """One 40-token request (10 ms a token) with a weight update 0.12 s into it; (result, server, done, stats).

    ``server.responses`` keeps the long request's records only; ``truth`` maps the server's weights labels to
    the versions the engine gave them."""
    server = byte_server(backend_options={"token_delay_s": 0.01, "mean_tokens": 10_000}, **server_options)
    checkpoint = tmp_path / "step-1"
    checkpoint.mkdir()

    async def main():
        async with ts.running(server) as url:
            async with engine(url, pause_mode=pause_mode,
                              weight_sync="transfer" if server.weight_transfer else "rpc") as eng:
                running = asyncio.ensure_future(eng.generate(req(1, max_tokens=40)))
                while not server.live:
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.12)
                assert await eng.update_weights(checkpoint) == 1
                done_at_update = running.done()
                later = await eng.generate(req(2, max_tokens=4))
                return await running, later, done_at_update, eng.stats()

    result, later, done_at_update, stats = run(main())
    assert later.weight_version == 1 and later.versions is None
    server.responses = [r for r in server.responses if r["max_tokens"] != 4]
    server.truth = {"default": 0, str(checkpoint): 1}
    return result, server, done_at_update, stats


def test_weight_update_mid_generation_each_token_carries_the_version_that_sampled_it(tmp_path):
    result, server, done_at_update, stats = update_mid_request(tmp_path, "abort")
    first, rest = server.responses
    assert first["finish_reason"] == "abort" and rest["input_ids"] == first["input_ids"] + first["output_ids"]
    assert result.output_ids == first["output_ids"] + rest["output_ids"] and len(result.output_ids) == 40
    assert result.logprobs == first["logprobs"] + rest["logprobs"] and result.finish_reason == "length"
    truth = [server.truth[label] for label in first["labels"] + rest["labels"]]
    assert result.versions == truth and truth[0] == 0 and truth[-1] == 1  # both versions, each token its own
    assert result.weight_version == 0 and stats["continued"] == 1 and stats["updates"] == 1 and not done_at_update
    assert rest["max_tokens"] == 40 - len(first["output_ids"])  # the continuation asks for the rest only
    assert [name for name, _ in server.control_log] == ["pause", "collective_rpc", "resume"]
    assert server.control_log[0][1]["mode"] == "abort"
    assert server.control_log[1][1] == {"method": "scaffold_load_weights", "args": [str(tmp_path / "step-1")]}


def test_pause_keep_keeps_the_request_on_the_server_and_marks_its_versions_inexact(tmp_path):
    result, server, done_at_update, stats = update_mid_request(tmp_path, "keep")
    (record,) = server.responses
    assert record["finish_reason"] == "length" and result.output_ids == record["output_ids"]  # kept, not aborted
    assert {server.truth[label] for label in record["labels"]} == {0, 1}  # it did cross the update
    assert result.versions is None and result.weight_version == 0  # vLLM does not say where: the older version
    assert result.meta["versions_exact"] is False and stats["inexact_versions"] == 1 and stats["continued"] == 0
    assert server.control_log[0] == ("pause", {"mode": "keep"})
    assert ("reset_prefix_cache", {}) in server.control_log


def test_pause_wait_lets_the_request_finish_on_the_old_weights(tmp_path):
    result, server, done_at_update, _ = update_mid_request(tmp_path, "wait")
    (record,) = server.responses
    assert done_at_update and set(record["labels"]) == {"default"} and len(result.output_ids) == 40
    assert result.weight_version == 0 and result.versions is None and "versions_exact" not in result.meta


def test_the_weight_transfer_apis_disk_backend_loads_a_checkpoint(tmp_path):
    result, server, _, _ = update_mid_request(tmp_path, "abort", weight_transfer="disk")
    assert [name for name, _ in server.control_log] == ["pause", "start_weight_update", "update_weights",
                                                        "finish_weight_update", "resume"]
    assert server.control_log[2][1] == {"update_info": {"path": str(tmp_path / "step-1")}}
    truth = [server.truth[label] for r in server.responses for label in r["labels"]]
    assert result.versions == truth and truth[0] == 0 and truth[-1] == 1


def test_weight_transfer_chunks_nccl_style(tmp_path):
    """A trainer that broadcasts the tensors itself hands the engine the update_info of each chunk."""
    server = byte_server(weight_transfer="nccl")

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                await eng.init_weight_transfer({"master_address": "127.0.0.1", "master_port": 29555,
                                                "rank_offset": 1, "world_size": 2})
                chunks = [{"names": ["a"], "dtype_names": ["bfloat16"], "shapes": [[2, 2]], "version": 3},
                          {"names": ["b"], "dtype_names": ["bfloat16"], "shapes": [[4]], "version": 3}]
                version = await eng.update_weights(chunks, version=3)
                return version, await eng.generate(req(1, max_tokens=3))

    version, result = run(main())
    assert version == 3 and result.weight_version == 3
    names = [name for name, _ in server.control_log]
    assert names == ["init_weight_transfer_engine", "pause", "start_weight_update", "update_weights",
                     "update_weights", "finish_weight_update", "resume"]
    assert server.control_log[0][1]["init_info"]["master_port"] == 29555


def test_a_failed_update_keeps_the_old_version_and_resumes_the_servers(tmp_path):
    server = byte_server(worker_extension=False)

    async def main():
        async with ts.running(server) as url:
            async with engine(url) as eng:
                errors = []
                for source in (tmp_path, None, 3):
                    with pytest.raises(EngineError) as info:
                        await eng.update_weights(source)
                    errors.append(str(info.value))
                after = await eng.generate(req(1, max_tokens=3))  # not left paused
                return eng.weight_version, errors, after, eng.paused_mode

    version, errors, after, paused = run(main())
    assert version == 0 and after.weight_version == 0 and paused is None and server.resume.is_set()
    assert "has no attribute 'scaffold_load_weights'" in errors[0] and "--worker-extension-cls" in errors[0]
    assert "checkpoint directory" in errors[1] and "got NoneType" in errors[1] and "got int" in errors[2]


def test_max_staleness_holds_on_tokens_of_two_versions(tmp_path):
    """A sample whose first tokens the old policy sampled counts as old as its oldest token."""
    result, _, _, _ = update_mid_request(tmp_path, "abort")
    prompt = req(1).prompt_ids
    sample = {"versions": [-1] * len(prompt) + result.token_versions(),  # as a trajectory maker lays it out
              "loss_mask": [0] * len(prompt) + [1] * len(result.output_ids)}
    assert oldest_version(sample) == 0 and max(sample["versions"]) == 1
    assert is_stale(sample, current_version=2, max_staleness=1)
    assert not is_stale(sample, current_version=1, max_staleness=1)
