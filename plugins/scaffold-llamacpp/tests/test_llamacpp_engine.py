"""The llamacpp engine on the bundled SmolLM2-135M GGUF file (skipped where llama-cpp-python is not installed)."""

from __future__ import annotations

import asyncio

import pytest

from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import render_chat

QUESTIONS = ["What is 2+3?", "Name a color.", "Count to five."]


def test_it_refuses_weight_updates_and_non_gguf_models_clearly():
    from scaffold_llamacpp import LlamaCppEngine

    with pytest.raises(ValueError, match="needs a .gguf file"):
        LlamaCppEngine(model=".")
    engine = LlamaCppEngine()
    with pytest.raises(EngineError, match="cannot take weight updates.*'transformers' engine"):
        asyncio.run(engine.update_weights({}))


@pytest.mark.model
@pytest.mark.xfail(reason="open defect: batched and lone runs diverge (logprobs by 0.09-0.21 nats, sometimes a "
                          "token); not yet known whether llama.cpp's batch-shaped kernels or this engine's batching "
                          "cause it", strict=False)
def test_batched_requests_give_what_each_gives_alone_with_logprobs_and_seeds():
    pytest.importorskip("llama_cpp")
    from scaffold_llamacpp import LlamaCppEngine

    async def main():
        async with LlamaCppEngine(max_batch_size=8, n_ctx=4096) as engine:
            prompts = [render_chat(engine.tokenizer, [{"role": "user", "content": q}])[1] for q in QUESTIONS]
            greedy = [GenerationRequest(f"g{i}", p, SamplingParams(max_tokens=10, temperature=0, top_logprobs=3))
                      for i, p in enumerate(prompts)]
            sampled = [GenerationRequest(f"s{i}", p, SamplingParams(max_tokens=10, temperature=1.0), seed=5 + i)
                       for i, p in enumerate(prompts)]
            together = await asyncio.gather(*(engine.generate(r) for r in greedy + sampled))
            alone = [await engine.generate(r) for r in greedy + sampled]
            again = await engine.generate(sampled[0])
            return together, alone, again, engine.stats()

    together, alone, again, stats = asyncio.run(main())
    assert stats["max_batch"] >= 2  # the concurrent requests shared decode steps
    for t, a in zip(together, alone):
        assert t.output_ids == a.output_ids and t.finish_reason == a.finish_reason
        # llama.cpp quantizes activations for its quantized matrix products, with kernels that depend on the
        # batch's shape: a token's logprob moves with the batch (measured 0.09-0.21 nats here)
        assert max(abs(x - y) for x, y in zip(t.logprobs, a.logprobs)) < 0.5
        assert t.finish_reason in ("stop", "length") and all(lp <= 0 for lp in t.logprobs)
    for g in together[:3]:  # greedy: the sampled token is the top one, with the same logprob
        assert all(g.output_ids[j] == max(top, key=top.get) for j, top in enumerate(g.top_logprobs))
        assert all(abs(top[g.output_ids[j]] - g.logprobs[j]) < 1e-6 for j, top in enumerate(g.top_logprobs))
    assert again.output_ids == together[3].output_ids  # a seed gives the same tokens
    assert "5" in together[0].text
