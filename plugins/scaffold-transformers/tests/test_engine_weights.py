"""Live weights in the embedded engine: wrapping a caller's model, loading new weights, versions, and what
happens to requests in flight during an update. A tiny random Llama and the byte tokenizer keep it fast."""

from __future__ import annotations

import asyncio
import threading

import pytest

from scaffold_core.engine import Engine
from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import ByteTokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class NoEosTokenizer(ByteTokenizer):
    eos_token_id = None  # a random model must not stop early: every request runs to max_tokens


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=ByteTokenizer().vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # nor may its generation config's EOS stop it
    return model


def request(rid: str, max_tokens: int = 8, prompt: tuple[int, ...] = (10, 11, 12, 13)) -> GenerationRequest:
    return GenerationRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0))


def teacher_forced(model, prompt, output):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(prompt) + output])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output)]


def close(a, b, tol=1e-4):
    return max(abs(x - y) for x, y in zip(a, b)) < tol


def wrapped(model=None, **options):
    from scaffold_transformers.transformers_engine import TransformersEngine

    return TransformersEngine.wrap(model if model is not None else tiny_model(), NoEosTokenizer(), **options)


def test_wrap_serves_the_callers_model_object_and_restores_its_mode():
    model = tiny_model().train()
    ids = {id(p) for p in model.parameters()}
    engine = wrapped(model)

    async def main():
        async with engine:
            assert engine.model is model and {id(p) for p in engine.model.parameters()} == ids
            return await engine.generate(request("a"))

    result = asyncio.run(main())
    assert model.training  # put back in train mode after the batch
    assert result.weight_version == 0 and len(result.output_ids) == 8
    assert close(result.logprobs, teacher_forced(model.eval(), (10, 11, 12, 13), result.output_ids))


def test_wrap_rejects_loading_options():
    with pytest.raises(ValueError, match="'dtype' does not apply"):
        wrapped(dtype="bfloat16")


def test_update_from_a_state_dict_and_from_a_checkpoint_moves_the_version(tmp_path):
    served = tiny_model(0)
    second, third = tiny_model(1), tiny_model(2)
    third.save_pretrained(tmp_path / "ckpt")
    engine = wrapped(served)

    async def main():
        async with engine:
            before = await engine.generate(request("a"))
            v1 = await engine.update_weights(second.state_dict())
            after_dict = await engine.generate(request("b"))
            v5 = await engine.update_weights(str(tmp_path / "ckpt"), version=5)
            after_dir = await engine.generate(request("c"))
            return before, v1, after_dict, v5, after_dir

    before, v1, after_dict, v5, after_dir = asyncio.run(main())
    assert (before.weight_version, v1, after_dict.weight_version, v5, after_dir.weight_version) == (0, 1, 1, 5, 5)
    assert engine.weight_version == 5
    prompt = (10, 11, 12, 13)
    assert close(after_dict.logprobs, teacher_forced(second, prompt, after_dict.output_ids))
    assert close(after_dir.logprobs, teacher_forced(third, prompt, after_dir.output_ids))
    assert not close(after_dir.logprobs, teacher_forced(second, prompt, after_dir.output_ids))
    assert torch.equal(served.model.embed_tokens.weight, third.model.embed_tokens.weight)  # copied in place
    assert engine.stats()["weight_updates"] == 2


def test_bad_weights_are_refused_and_the_old_ones_kept(tmp_path):
    engine = wrapped()
    state = {k: v.clone() for k, v in engine._lent[0].state_dict().items()}

    async def main():
        async with engine:
            errors = []
            for source in ({"no.such.weight": torch.zeros(1)},
                           {"lm_head.weight": torch.zeros(3, 3)},
                           str(tmp_path / "missing"),
                           str(tmp_path)):
                with pytest.raises(EngineError) as info:
                    await engine.update_weights(source)
                errors.append(str(info.value))
            with pytest.raises(EngineError, match="never go backwards"):
                await engine.update_weights(None, version=-1)
            return errors

    errors = asyncio.run(main())
    assert "no.such.weight" in errors[0] and "shape (3, 3)" in errors[1]
    assert "not a directory" in errors[2] and "no model.safetensors" in errors[3]
    assert engine.weight_version == 0
    assert all(torch.equal(v, engine.model.state_dict()[k]) for k, v in state.items())


def test_a_request_in_flight_during_an_update_goes_on_on_the_new_weights_with_a_version_per_token():
    """A request decoding when update_weights is called goes on from the tokens it has on the new weights (its
    KV cache recomputed): its result holds tokens of both versions, each with its own version and the logprob
    of the weights that sampled it. Requests after the update run on the new weights alone."""
    served, new = tiny_model(0), tiny_model(1)
    old = tiny_model(0)
    decoding = threading.Event()

    def slow_down(module, args):
        decoding.set()
        threading.Event().wait(0.01)  # each forward takes >= 10 ms: the update surely lands mid-request

    served.register_forward_pre_hook(slow_down)
    engine = wrapped(served)

    async def main():
        async with engine:
            running = asyncio.ensure_future(engine.generate(request("long", max_tokens=40)))
            while not decoding.is_set():
                await asyncio.sleep(0.005)
            version = await engine.update_weights(new.state_dict())
            assert not running.done()  # applied between two decode steps, not after the request
            later = await engine.generate(request("later", max_tokens=8))
            return await running, version, later

    in_flight, version, later = asyncio.run(main())
    prompt = (10, 11, 12, 13)
    assert version == 1 and len(in_flight.output_ids) == 40
    switch = in_flight.versions.index(1)
    assert 0 < switch < 40 and in_flight.versions == [0] * switch + [1] * (40 - switch)
    assert in_flight.weight_version == 0  # the oldest version of its tokens
    assert close(in_flight.logprobs[:switch], teacher_forced(old, prompt, in_flight.output_ids)[:switch])
    assert close(in_flight.logprobs[switch:], teacher_forced(new, prompt, in_flight.output_ids)[switch:])
    assert later.weight_version == 1 and later.versions == [1] * 8
    assert close(later.logprobs, teacher_forced(new, prompt, later.output_ids))
    # where its time went (the episode's timeline): the update's wait and the new prefill inside its decoding
    spans = in_flight.meta["spans"]
    assert [p for p, _, _ in spans] == ["queued", "prefill", "decode", "weight_wait", "prefill", "decode"]
    assert all(a <= b for _, a, b in spans) and all(x[2] <= y[1] + 1e-9 for x, y in zip(spans, spans[1:]))
    assert [p for p, _, _ in later.meta["spans"]] == ["queued", "prefill", "decode"]


def test_an_update_refused_mid_request_leaves_the_request_on_the_old_weights():
    served, old = tiny_model(0), tiny_model(0)
    decoding = threading.Event()

    def slow_down(module, args):
        decoding.set()
        threading.Event().wait(0.01)

    served.register_forward_pre_hook(slow_down)
    engine = wrapped(served)

    async def main():
        async with engine:
            running = asyncio.ensure_future(engine.generate(request("long", max_tokens=20)))
            while not decoding.is_set():
                await asyncio.sleep(0.005)
            with pytest.raises(EngineError, match="no.such.weight"):
                await engine.update_weights({"no.such.weight": torch.zeros(1)})
            return await running

    result = asyncio.run(main())
    assert result.versions == [0] * 20 and engine.weight_version == 0
    assert close(result.logprobs, teacher_forced(old, (10, 11, 12, 13), result.output_ids))


def test_engines_without_weight_updates_say_so():
    class Plain(Engine):
        pass

    with pytest.raises(EngineError, match="cannot update its weights"):
        asyncio.run(Plain().update_weights("/some/checkpoint"))
    assert Plain().weight_version == 0


def test_update_before_start_is_an_error():
    with pytest.raises(EngineError, match="not started"):
        asyncio.run(wrapped().update_weights(None))
