"""Continuous batching in the embedded engine, on a tiny random Llama (fast): requests joining a running
batch, rows leaving it, the keys and values kept for a conversation's next turn, and closing mid-decode."""

from __future__ import annotations

import asyncio

import pytest
from scaffold_testkit.models import NoEosTokenizer, tiny_llama

from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")




def prompt(i: int) -> list[int]:
    return [20 + (i * 7 + j) % 90 for j in range(18 + 3 * i)]  # long enough for the prefix store (16 tokens)


def engine(model, **options):
    from scaffold_transformers.transformers_engine import TransformersEngine

    return TransformersEngine.wrap(model, NoEosTokenizer(), max_batch_size=16, batch_wait_ms=0, **options)


def test_rows_joining_and_leaving_get_what_they_get_alone_and_next_turns_reuse_their_keys():
    model = tiny_llama()
    sampling = [SamplingParams(max_tokens=m, temperature=t) for m, t in ((30, 1.0), (3, 0.8), (5, 0.0), (9, 1.0),
                                                                         (2, 1.0), (14, 0.7))]
    first = [GenerationRequest(f"a{i}", prompt(i), sampling[i], seed=i) for i in range(3)]
    late = [GenerationRequest(f"b{i}", prompt(i), sampling[i], seed=10 + i) for i in range(3, 6)]

    async def staggered(eng):
        """Three requests start a batch; the others arrive one by one while it decodes."""
        running = [asyncio.ensure_future(eng.generate(r)) for r in first]
        tokens = asyncio.Queue()
        probe = GenerationRequest("probe", prompt(7), SamplingParams(max_tokens=40, temperature=1.0), seed=99,
                                  on_token=tokens.put_nowait)
        running.append(asyncio.ensure_future(eng.generate(probe)))
        joined = []
        for r in late:
            for _ in range(3):  # a few decode steps apart
                await asyncio.wait_for(tokens.get(), 60)
            joined.append(asyncio.ensure_future(eng.generate(r)))
        results = await asyncio.gather(*running, *joined)
        return results[:3] + results[4:]

    async def alone(eng, requests):
        return [await eng.generate(r) for r in requests]

    async def main():
        async with engine(model) as eng, engine(model, prefix_cache_mb=0) as plain:
            together = await staggered(eng)
            stats = eng.stats()
            assert stats["batches"] == 1 and stats["joined"] == 3
            one_by_one = await alone(plain, first + late)
            # the next turn of each conversation: its prompt extends the finished sequence
            turn = [GenerationRequest(f"c{i}", r.prompt_ids + out.output_ids + [40, 41, 42], sampling[0], seed=5)
                    for i, (r, out) in enumerate(zip(first + late, together))]
            reused_before = eng.stats()["prefix_tokens_reused"]
            again = await asyncio.gather(*(eng.generate(r) for r in turn))
            # every token but the last output token (whose keys were never computed) and the three new ones
            assert eng.stats()["prefix_tokens_reused"] - reused_before == sum(len(r.prompt_ids) - 4 for r in turn)
            fresh = await alone(plain, turn)
            return together, one_by_one, again, fresh

    together, one_by_one, again, fresh = asyncio.run(main())
    assert [len(r.output_ids) for r in together] == [s.max_tokens for s in sampling]
    for a, b in list(zip(together, one_by_one)) + list(zip(again, fresh)):
        assert a.output_ids == b.output_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5


def test_closing_the_engine_fails_the_requests_it_was_decoding():
    async def main():
        eng = engine(tiny_llama())
        await eng.start()
        started = asyncio.Event()
        request = GenerationRequest("long", prompt(0), SamplingParams(max_tokens=480, temperature=1.0), seed=1,
                                    on_token=lambda _: started.set())
        running = asyncio.ensure_future(eng.generate(request))
        await asyncio.wait_for(started.wait(), 60)
        await eng.close()
        with pytest.raises(EngineError, match="closed"):
            await asyncio.wait_for(running, 60)

    asyncio.run(main())


def teacher_forced(model, prompt_ids, output_ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + output_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(prompt_ids) - 1 + j, t].item() for j, t in enumerate(output_ids)]


@pytest.mark.parametrize("lean_forward", [True, False], ids=["lean", "transformers-forward"])
def test_a_wrapped_model_in_train_mode_keeps_its_mode_and_is_decoded_without_dropout(lean_forward):
    """A trainer whose rollouts are answered reads ``model.training`` at once (TRL does, to tell a training step
    from an evaluation): the engine leaves the mode as the owner set it, even while other requests still decode,
    and still samples without dropout (logprobs those of the model in eval mode)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=NoEosTokenizer().vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, attention_dropout=0.5)
    model = transformers.LlamaForCausalLM(config).train()
    long = GenerationRequest("long", prompt(1), SamplingParams(max_tokens=400, temperature=1.0), seed=2)
    short = GenerationRequest("short", prompt(0), SamplingParams(max_tokens=3, temperature=1.0), seed=1)

    async def main():
        async with engine(model, lean_forward=lean_forward) as eng:
            running = asyncio.ensure_future(eng.generate(long))
            short_result = await eng.generate(short)
            modes = [model.training]  # the long request may still be decoding (it does, joined)
            while not running.done():  # the owner looks again and again while the worker thread decodes
                modes.append(model.training)
                await asyncio.sleep(0.001)
            long_result = await running
            return short_result, modes, long_result, model.training

    short_result, modes, long_result, mode_after = asyncio.run(main())
    assert len(modes) > 10 and all(modes) and mode_after
    model.eval()
    for request, result in ((short, short_result), (long, long_result)):
        expected = teacher_forced(model, request.prompt_ids, result.output_ids)
        assert max(abs(a - b) for a, b in zip(result.logprobs, expected)) <= 1e-4
