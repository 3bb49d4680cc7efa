"""The engine's load: weights rounded and packed on a spare core while the engine imports transformers
(``preload.py``), the engine then holding the very weights and copies it would have made, and a preload that
does not fit the model left unused; Python's garbage collector paused while it loads, and left as it was."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaffold_transformers import transformers_engine  # noqa: E402
from scaffold_transformers.packed_weights import packing_unsupported  # noqa: E402
from scaffold_transformers.transformers_engine import TransformersEngine  # noqa: E402

pytestmark = pytest.mark.skipif(packing_unsupported(torch, torch.float32, "cpu") is not None,
                                reason="this torch build cannot pack weights")

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17]]


async def _run(folder, tokens: int = 8):
    engine = TransformersEngine(model=str(folder), device="cpu", threads=1)
    async with engine:
        before = engine.stats()
        weights = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
        results = await asyncio.gather(*(engine.generate(GenerationRequest(
            f"r{i}", p, SamplingParams(max_tokens=tokens, temperature=1.0), seed=i)) for i, p in enumerate(PROMPTS)))
        return before, weights, [(r.output_ids, r.logprobs) for r in results]


def _preload_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "scaffold-preload" and t.is_alive()]


@pytest.fixture
def spare_core(monkeypatch):
    """The preload runs where a core is spare: this machine counts as two cores whatever it has."""
    monkeypatch.setattr(transformers_engine, "usable_cores", lambda: 2)


def test_preloaded_weights_and_copies_are_those_the_engine_makes_itself(tiny_policy, spare_core, monkeypatch):
    stats, weights, out = asyncio.run(_run(tiny_policy))
    assert stats["preloaded"] is True
    assert stats["weight_packs"] == 5  # q/k/v, o, gate/up, down and the (tied) output layer, before any request
    assert not _preload_threads()

    monkeypatch.setattr(TransformersEngine, "_start_preload", lambda self: None)
    plain_stats, plain_weights, plain_out = asyncio.run(_run(tiny_policy))
    assert plain_stats["preloaded"] is False and plain_stats["weight_packs"] == 0
    assert weights.keys() == plain_weights.keys()
    assert all(torch.equal(weights[name], plain_weights[name]) for name in weights)  # rounded alike
    assert out == plain_out  # the same ids and logprobs, bit for bit


def test_a_preload_from_another_models_file_is_not_used(tiny_policy, tmp_path, spare_core, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    other.save_pretrained(tmp_path)  # the same names as the engine's model (tied too), other shapes
    monkeypatch.setattr(transformers_engine, "preload_path", lambda source: tmp_path / "model.safetensors")
    stats, weights, out = asyncio.run(_run(tiny_policy))
    assert stats["preloaded"] is False
    assert not _preload_threads()

    monkeypatch.setattr(TransformersEngine, "_start_preload", lambda self: None)
    _, plain_weights, plain_out = asyncio.run(_run(tiny_policy))
    assert all(torch.equal(weights[name], plain_weights[name]) for name in weights)
    assert out == plain_out


def test_no_preload_where_the_engine_would_not_round_the_weights(tiny_policy, spare_core):
    async def loaded(**options):
        engine = TransformersEngine(model=str(tiny_policy), device="cpu", threads=1, **options)
        async with engine:
            return engine.stats().get("preloaded"), engine._lean is not None and engine._lean.half

    assert asyncio.run(loaded(float16_weights=False)) == (False, False)
    assert asyncio.run(loaded(dtype="bfloat16"))[0] is False


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_while_the_engine_loads_and_left_as_it_was(tiny_policy, monkeypatch, enabled):
    seen = []
    load = transformers_engine.load_model_and_tokenizer

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return load(*args, **kwargs)

    monkeypatch.setattr(transformers_engine, "load_model_and_tokenizer", watched)
    (gc.enable if enabled else gc.disable)()
    try:
        asyncio.run(_run(tiny_policy, tokens=2))
        assert seen == [False]
        assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_one_collection_follows_a_load_that_made_many_objects_and_none_a_light_one(tiny_policy, monkeypatch):
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args) or 0)
    load = transformers_engine.load_model_and_tokenizer
    kept = []

    def heavy(*args, **kwargs):  # as importing torch and transformers does
        kept.append([[i] for i in range(transformers_engine.COLLECT_AFTER + 1000)])
        return load(*args, **kwargs)

    asyncio.run(_run(tiny_policy, tokens=2))  # torch and transformers are imported already: a light load
    assert collections == []
    monkeypatch.setattr(transformers_engine, "load_model_and_tokenizer", heavy)
    asyncio.run(_run(tiny_policy, tokens=2))
    assert len(collections) == 1
