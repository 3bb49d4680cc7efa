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

from scaffold_transformers.packed_weights import (  # noqa: E402
    half_unsupported,
    model_half_unsupported,
    packing_unsupported,
)
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


def loads(monkeypatch, module, model):
    """``module``'s ``load_model_and_tokenizer`` gives ``model`` (as if loaded from a file)."""
    monkeypatch.setattr(module, "load_model_and_tokenizer",
                        lambda *a, **k: (model, NoEosTokenizer(), {"source": "tiny", "cached": False}))


def owned(monkeypatch, model, **options):
    """An engine that loads ``model`` itself (as from a file): the model is the engine's own."""
    from scaffold_transformers import transformers_engine

    loads(monkeypatch, transformers_engine, model)
    return TransformersEngine(**options)


needs_half = pytest.mark.skipif(half_unsupported(torch, 1.0) is not None, reason="no fbgemm float16 kernel")


@needs_half
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_float16_copies_of_an_owned_model_round_it_so_its_forward_gives_the_logprobs_sampled(monkeypatch, kind):
    model, exact = tiny(kind), tiny(kind)

    async def main():
        async with owned(monkeypatch, model) as engine, \
                TransformersEngine.wrap(exact, NoEosTokenizer(), pack_weights=True) as float32:
            return await generate(engine, "h"), await generate(float32, "f"), engine.stats()

    half, full, stats = asyncio.run(main())
    assert stats["packed_dtype"] == "float16" and stats["weight_packs"] > 0
    weight = model.model.layers[0].mlp.up_proj.weight
    assert torch.equal(weight, weight.half().float())  # the engine's model holds what its copies hold
    assert not torch.equal(exact.model.layers[0].mlp.up_proj.weight, weight)
    assert torch.equal(model.model.norm.weight, exact.model.norm.weight)  # only the products' weights
    assert worst_gap(model, half) <= 1e-5  # the rounded model's own forward gives the logprobs sampled
    assert worst_gap(exact, half) > worst_gap(exact, full)  # against the unrounded weights, the rounding shows


@needs_half
def test_an_update_to_an_owned_model_is_rounded_too(monkeypatch):
    model, other = tiny(seed=0), tiny(seed=2)

    async def main():
        async with owned(monkeypatch, model) as engine:
            await generate(engine, "a")
            await engine.update_weights(other.state_dict())
            return await generate(engine, "b")

    result = asyncio.run(main())
    assert torch.equal(model.lm_head.weight, other.lm_head.weight.half().float())
    assert worst_gap(model, result) <= 1e-5


@needs_half
def test_a_wrapped_model_keeps_its_weights_and_float32_copies_unless_asked(monkeypatch):
    model = tiny()
    before = [p.detach().clone() for p in model.parameters()]

    async def main(**options):
        async with TransformersEngine.wrap(model, NoEosTokenizer(), pack_weights=True, **options) as engine:
            return await generate(engine, "w", max_tokens=4), engine.stats()

    full, stats = asyncio.run(main())
    assert stats["packed_dtype"] == "float32" and "float16_unsupported" not in stats
    half, stats = asyncio.run(main(float16_weights=True))
    assert stats["packed_dtype"] == "float16"
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the owner's weights, untouched
    assert worst_gap(model, full) <= 1e-4 and worst_gap(model, full) < worst_gap(model, half) <= 1e-2


@needs_half
def test_a_nan_in_any_weight_keeps_the_model_out_of_float16():
    model = tiny()
    assert model_half_unsupported(torch, model) is None
    with torch.no_grad():  # a later weight than the first: a plain max() over the weights' maxima would miss it
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    assert "beyond float16's range" in model_half_unsupported(torch, model)


def test_what_cannot_be_kept_in_float16_says_why(monkeypatch):
    assert "beyond float16's range" in half_unsupported(torch, 70000.0)
    assert "beyond float16's range" in half_unsupported(torch, float("nan"))
    model = tiny()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = 1e6

    async def main():
        async with owned(monkeypatch, model) as engine:
            await generate(engine, "a", max_tokens=2)
            return engine.stats()

    stats = asyncio.run(main())
    assert stats["packed_dtype"] == "float32" and stats["weight_packs"] > 0
    assert "float16" in stats["float16_unsupported"]
    assert model.model.layers[1].mlp.down_proj.weight[0, 0].item() == 1e6  # nothing rounded


@needs_half
@pytest.mark.parametrize("option", [None, False])
def test_a_teacher_loaded_on_cpu_is_rounded_as_the_engine_is_unless_told_not_to(monkeypatch, option):
    from scaffold_transformers import teacher as teacher_module

    model, exact = tiny(), tiny()
    loads(monkeypatch, teacher_module, model)
    teacher = teacher_module.TransformersTeacher(device="cpu", float16_weights=option)
    asyncio.run(teacher.start())
    weight, loaded = model.model.layers[0].self_attn.o_proj.weight, exact.model.layers[0].self_attn.o_proj.weight
    assert torch.equal(weight, loaded.half().float() if option is None else loaded)


def test_a_teacher_the_engine_would_not_round_is_not_rounded(monkeypatch):
    """Only what the engine's lean forward serves is rounded by the engine, so only that is by a teacher."""
    from scaffold_transformers import teacher as teacher_module

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=ByteTokenizer().vocab_size, n_embd=32, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    before = model.lm_head.weight.detach().clone()
    loads(monkeypatch, teacher_module, model)
    teacher = teacher_module.TransformersTeacher(device="cpu")
    asyncio.run(teacher.start())
    assert teacher.float16_unsupported and "gpt2" in teacher.float16_unsupported
    assert torch.equal(model.lm_head.weight, before)


@needs_half
def test_float16_copies_that_with_the_rounded_weights_do_not_fit_in_memory_leave_float32_copies(monkeypatch):
    """Rounding gives an owned model's weights storage of their own: 4 bytes a weight beside the 2 of its
    copies. Where the 6 do not fit in half the memory available but float32 copies' 4 do, those are made."""
    from scaffold_transformers import packed_weights

    model = tiny()
    count = sum(w.numel() for w in packed_weights.linear_weights(torch, model))
    monkeypatch.setattr(packed_weights, "available_memory", lambda: 2 * 5 * count)
    before = model.lm_head.weight.detach().clone()

    async def main():
        async with owned(monkeypatch, model) as engine:
            return await generate(engine, "m", max_tokens=4), engine.stats()

    result, stats = asyncio.run(main())
    assert stats["packed_dtype"] == "float32" and stats["weight_packs"] > 0
    assert "rounded weights' own storage" in stats["float16_unsupported"]
    assert torch.equal(model.lm_head.weight, before)  # not rounded
    assert worst_gap(model, result) <= 1e-4
