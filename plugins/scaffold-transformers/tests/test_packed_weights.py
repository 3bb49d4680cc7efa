"""Packed copies of the weights on CPU (``packed_weights.py``): the same numbers as the model's own products, and
never a stale copy, whatever way the weights change. Tiny random models and the byte tokenizer keep it fast."""

from __future__ import annotations

import asyncio

import pytest

from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import ByteTokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from scaffold_transformers.packed_weights import packing_unsupported  # noqa: E402
from scaffold_transformers.transformers_engine import TransformersEngine  # noqa: E402

pytestmark = pytest.mark.skipif(packing_unsupported(torch, torch.float32, "cpu") is not None,
                                reason="this torch build cannot pack weights")

PROMPTS = [(10, 11, 12, 13), (20, 21, 22), (30, 31, 32, 33, 34, 35)]


class NoEosTokenizer(ByteTokenizer):
    eos_token_id = None  # a random model must not stop early


def tiny(kind: str = "llama", seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=ByteTokenizer().vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    if kind == "qwen2":  # q, k and v have biases
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_()
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
    model.generation_config.eos_token_id = None
    return model


def teacher_forced(model, prompt, output):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(prompt) + output])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output)]


def worst_gap(model, results):
    return max(max(abs(a - b) for a, b in zip(r.logprobs, teacher_forced(model, p, r.output_ids)))
               for p, r in zip(PROMPTS, results))


async def generate(engine, tag: str, max_tokens: int = 12):
    reqs = [GenerationRequest(f"{tag}{i}", list(p), SamplingParams(max_tokens=max_tokens, temperature=1.0), seed=i)
            for i, p in enumerate(PROMPTS)]
    return await asyncio.gather(*(engine.generate(r) for r in reqs))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_packed_products_give_what_the_models_own_forward_gives(kind):
    model = tiny(kind)

    async def main():
        async with TransformersEngine.wrap(model, NoEosTokenizer(), pack_weights=True) as packed, \
                TransformersEngine.wrap(model, NoEosTokenizer(), pack_weights=False) as plain:
            return await generate(packed, "p"), await generate(plain, "u"), packed.stats()["weight_packs"]

    with_packing, without, packs = asyncio.run(main())
    assert packs > 0  # the packed products really ran
    assert [r.output_ids for r in with_packing] == [r.output_ids for r in without]
    assert worst_gap(model, with_packing) <= 1e-4


def copy_in_place(model, other):
    with torch.no_grad():  # what an optimizer's step does: in place, counted in each tensor's version
        for mine, theirs in zip(model.parameters(), other.parameters()):
            mine.copy_(theirs)


def give_new_storage(model, other):
    for mine, theirs in zip(model.parameters(), other.parameters()):
        mine.data = theirs.detach().clone()  # new storage; torch counts no change to the old


def copy_through_data(model, other):
    for mine, theirs in zip(model.parameters(), other.parameters()):
        mine.data.copy_(theirs)  # through .data: no version counted, the same storage


@pytest.mark.parametrize("change, tell", [(copy_in_place, False), (give_new_storage, False),
                                          (copy_through_data, True)],
                         ids=["in-place-untold", "new-storage-untold", "through-data-then-update"])
def test_the_next_request_sees_the_weights_as_changed(change, tell):
    """Copies are made again for changes torch counts (told or not), and dropped by an update (``tell``: the
    owner calls ``update_weights(None)``) for a change it does not count."""
    model, other = tiny(seed=0), tiny(seed=1)

    async def main():
        async with TransformersEngine.wrap(model, NoEosTokenizer(), pack_weights=True) as engine:
            await generate(engine, "a")
            change(model, other)
            if tell:
                await engine.update_weights(None)
            return await generate(engine, "b")

    assert worst_gap(other, asyncio.run(main())) <= 1e-4  # the new weights, not copies of the old ones


def test_a_wrapped_model_is_read_as_it_is_unless_packing_is_asked_for():
    async def main():
        async with TransformersEngine.wrap(tiny(), NoEosTokenizer()) as engine:
            await generate(engine, "a", max_tokens=2)
            return engine._lean

    lean = asyncio.run(main())
    assert lean.packed is None and lean.pack_unsupported == "pack: false"


def test_what_cannot_be_packed_says_why():
    assert "float16" in packing_unsupported(torch, torch.float16, "cpu")
    assert "CPU" in packing_unsupported(torch, torch.float32, "cuda")
    bf16 = packing_unsupported(torch, torch.bfloat16, "cpu")
    assert bf16 is None or "bfloat16" in bf16


def test_copies_of_parameters_a_model_no_longer_has_are_dropped():
    model, other = tiny(seed=0), tiny(seed=4)

    async def main():
        async with TransformersEngine.wrap(model, NoEosTokenizer(), pack_weights=True) as engine:
            await generate(engine, "a")
            before = len(engine._lean.packed._copies)
            for layer, new in zip(model.model.layers, other.model.layers):
                layer.mlp = new.mlp  # new parameter objects: the old ones' copies must not be kept
            result = await generate(engine, "b")
            return before, len(engine._lean.packed._copies), result

    before, after, result = asyncio.run(main())
    assert after == before
    assert worst_gap(model, result) <= 1e-4


def test_weights_too_large_for_the_memory_left_are_not_packed(monkeypatch):
    from scaffold_transformers import packed_weights

    monkeypatch.setattr(packed_weights, "available_memory", lambda: 3 * 2**30)
    assert packing_unsupported(torch, torch.float32, "cpu", nbytes=1 * 2**30) is None
    why = packing_unsupported(torch, torch.float32, "cpu", nbytes=2 * 2**30)
    assert "2.0 GiB" in why and "3.0 GiB" in why

    monkeypatch.setattr(packed_weights, "available_memory", lambda: 2**10)  # any model is too large now

    async def main():
        async with TransformersEngine.wrap(tiny(), NoEosTokenizer(), pack_weights=True) as engine:
            await generate(engine, "a", max_tokens=2)
            return engine._lean, engine.stats()

    lean, stats = asyncio.run(main())
    assert lean.packed is None and stats["weight_packs"] == 0
    assert "more than half the memory available" in stats["pack_unsupported"]
