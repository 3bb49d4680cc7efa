"""The embedded engine's in-place KV cache: the same keys, values, tokens and logprobs as transformers'
growing DynamicCache, through growth, rows leaving the batch, and group expansion. A tiny random Llama keeps
it fast."""

from __future__ import annotations

import asyncio

import pytest
from scaffold_testkit.models import NoEosTokenizer, tiny_llama

from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")




def test_reserved_layers_hold_what_concatenation_holds_through_growth_selection_and_crop():
    from transformers import DynamicCache

    from scaffold_transformers import kv_cache

    reserved, plain = kv_cache.reserved_cache(reserve=150), DynamicCache()
    assert isinstance(reserved, DynamicCache)  # the model sees the cache type it expects
    torch.manual_seed(1)

    def step(tokens: int, rows: int) -> None:
        k, v = torch.randn(rows, 2, tokens, 8), torch.randn(rows, 2, tokens, 8)
        got, want = reserved.update(k, v, 0), plain.update(k.clone(), v.clone(), 0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    step(7, rows=4)  # the prefill: 7 tokens, room reserved after them
    assert type(reserved.layers[0]).__name__ == "ReservedLayer"
    for _ in range(80):  # past the first reservation (64 + 7): the layer grows and keeps what it held
        step(1, rows=4)
    keep = torch.tensor([3, 1])
    reserved.batch_select_indices(keep)
    plain.batch_select_indices(keep)
    for _ in range(5):
        step(1, rows=2)
    assert reserved.get_seq_length() == plain.get_seq_length() == 92
    reserved.crop(-3)
    plain.crop(-3)
    step(1, rows=2)
    assert reserved.get_seq_length() == 90
    reserved.reset()
    assert reserved.get_seq_length() == 0


def test_engine_tokens_and_logprobs_are_identical_with_and_without_the_reserved_cache():
    from scaffold_transformers.transformers_engine import TransformersEngine

    engine = TransformersEngine.wrap(tiny_llama(), NoEosTokenizer(), max_batch_size=16, batch_wait_ms=50)
    prompts = [[10, 11, 12, 13], [20, 21], [10, 11, 12, 13], [30, 31, 32, 33, 34, 35]]
    plans = [(3, 1.0, 1.0), (90, 1.0, 1.0), (12, 0.0, 1.0), (40, 0.8, 0.9)]  # max_tokens, temperature, top_p
    requests = [GenerationRequest(f"r{i}", prompts[i], SamplingParams(max_tokens=m, temperature=t, top_p=p), seed=i)
                for i, (m, t, p) in enumerate(plans)]

    async def run(reserve: bool):
        engine.reserve_cache = reserve
        before = engine.stats()["batches"]
        results = await asyncio.gather(*(engine.generate(r) for r in requests))
        assert engine.stats()["batches"] - before == 1  # one batch: rows leave it at 3, 12 and 40 tokens
        return results

    async def main():
        async with engine:
            return await run(False), await run(True)

    plain, reserved = asyncio.run(main())
    assert [len(r.output_ids) for r in reserved] == [3, 90, 12, 40]
    for a, b in zip(plain, reserved):
        assert a.output_ids == b.output_ids
        assert a.logprobs == b.logprobs  # the same numbers, not merely close
