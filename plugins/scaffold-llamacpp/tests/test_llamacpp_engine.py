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
def test_batched_requests_give_what_each_gives_alone_with_logprobs_and_seeds():
    """With batch_invariant, a request's tokens and logprobs are the same bit for bit alone or batched (llama.cpp
    itself is not: see the engine's _load and _decode)."""
    pytest.importorskip("llama_cpp")
    from scaffold_llamacpp import LlamaCppEngine

    async def main():
        async with LlamaCppEngine(max_batch_size=8, n_ctx=4096, batch_invariant=True) as engine:
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
        assert t.logprobs == a.logprobs
        assert t.finish_reason in ("stop", "length") and all(lp <= 0 for lp in t.logprobs)
    for g in together[:3]:  # greedy: the sampled token is the top one, with the same logprob
        assert all(g.output_ids[j] == max(top, key=top.get) for j, top in enumerate(g.top_logprobs))
        assert all(abs(top[g.output_ids[j]] - g.logprobs[j]) < 1e-6 for j, top in enumerate(g.top_logprobs))
    assert again.output_ids == together[3].output_ids  # a seed gives the same tokens
    assert "5" in together[0].text


@pytest.mark.model
def test_a_prompt_longer_than_a_sequences_cells_fails_alone_and_says_what_to_raise():
    pytest.importorskip("llama_cpp")
    from scaffold_llamacpp import LlamaCppEngine

    async def main():
        async with LlamaCppEngine(max_batch_size=3, n_ctx=256, batch_invariant=True) as engine:
            short = engine.generate(GenerationRequest("ok", [1, 2, 3], SamplingParams(max_tokens=2)))
            long = engine.generate(GenerationRequest("long", list(range(10, 80)), SamplingParams(max_tokens=2)))
            return await asyncio.gather(short, long, return_exceptions=True)

    short, long = asyncio.run(main())
    assert len(short.output_ids) == 2  # the other request is served
    assert isinstance(long, EngineError) and "70 tokens does not fit a sequence's 64 KV cells" in str(long)
    assert "raise engine.n_ctx or lower engine.max_batch_size" in str(long)
