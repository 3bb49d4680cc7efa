"""The embedded transformers engine on the real SmolLM2-135M-Instruct model (few, tiny, shared)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import render_chat

pytestmark = pytest.mark.model
torch = pytest.importorskip("torch")

QUESTIONS = ["What is 2+3?", "Name a color.", "Count to five.", "What is the capital of France?"]


class LoopThread:
    """An event loop on a background thread, so one started engine serves every test."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=600):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@pytest.fixture(scope="module")
def engine():
    from scaffold_transformers.transformers_engine import TransformersEngine

    runner = LoopThread()
    eng = TransformersEngine(max_batch_size=8, batch_wait_ms=20)
    runner.run(eng.start())
    eng.runner = runner
    yield eng
    runner.run(eng.close())
    runner.stop()


def prompts(engine):
    return [render_chat(engine.tokenizer, [{"role": "user", "content": q}])[1] for q in QUESTIONS]


def generate_all(engine, requests):
    async def go():
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    return engine.runner.run(go())


def generate_one_by_one(engine, requests):
    async def go():
        return [await engine.generate(r) for r in requests]

    return engine.runner.run(go())


def teacher_forced_logprobs(engine, prompt_ids, output_ids, temperature):
    with torch.inference_mode():
        logits = engine.model(torch.tensor([prompt_ids + output_ids])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    n = len(prompt_ids)
    return [logp[n - 1 + j, tok].item() for j, tok in enumerate(output_ids)]


def test_batched_greedy_equals_unbatched_greedy(engine):
    reqs = [GenerationRequest(f"g{i}", ids, SamplingParams(max_tokens=12, temperature=0))
            for i, ids in enumerate(prompts(engine))]
    batched = generate_all(engine, reqs)
    single = generate_one_by_one(engine, reqs)
    assert engine.stats()["max_batch"] >= 2  # the concurrent requests really shared a batch
    for b, s in zip(batched, single):
        assert b.output_ids == s.output_ids
        assert b.finish_reason == s.finish_reason
        assert max(abs(x - y) for x, y in zip(b.logprobs, s.logprobs)) < 1e-3


def test_logprobs_match_a_teacher_forced_forward_pass(engine):
    reqs = [GenerationRequest(f"s{i}", ids, SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9, top_k=40),
                              seed=100 + i) for i, ids in enumerate(prompts(engine))]
    results = generate_all(engine, reqs)
    worst = 0.0
    for req, res in zip(reqs, results):
        assert len(res.output_ids) == len(res.logprobs) > 0
        expected = teacher_forced_logprobs(engine, req.prompt_ids, res.output_ids, 0.7)
        worst = max(worst, max(abs(a - b) for a, b in zip(expected, res.logprobs)))
    assert worst <= 1e-3


def test_top_logprobs_are_the_reported_distributions_top_k(engine):
    ids = prompts(engine)
    reqs = [GenerationRequest("t0", ids[0], SamplingParams(max_tokens=6, temperature=0.7, top_logprobs=5), seed=3),
            GenerationRequest("t1", ids[1], SamplingParams(max_tokens=6, temperature=0.0, top_logprobs=2)),
            GenerationRequest("t2", ids[2], SamplingParams(max_tokens=6, temperature=0.7), seed=4)]
    asked, greedy, plain = generate_all(engine, reqs)  # one batch: rows with and without top logprobs
    assert plain.top_logprobs is None
    for req, res, k, temperature in ((reqs[0], asked, 5, 0.7), (reqs[1], greedy, 2, 1.0)):
        res.check()
        assert len(res.top_logprobs) == len(res.output_ids) and all(len(t) == k for t in res.top_logprobs)
        with torch.inference_mode():
            logits = engine.model(torch.tensor([req.prompt_ids + res.output_ids])).logits[0].float()
        logp = torch.log_softmax(logits / temperature, dim=-1)
        for j, top in enumerate(res.top_logprobs):
            values, tokens = torch.topk(logp[len(req.prompt_ids) - 1 + j], k)
            assert sorted(top) == sorted(tokens.tolist())
            assert max(abs(top[t] - v) for t, v in zip(tokens.tolist(), values.tolist())) < 1e-3
            if res.output_ids[j] in top:  # the sampled token's logprob is the same number
                assert abs(top[res.output_ids[j]] - res.logprobs[j]) < 1e-5
    assert all(greedy.output_ids[j] == max(t, key=t.get) for j, t in enumerate(greedy.top_logprobs))


def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    ids = prompts(engine)
    reqs = [GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=10, temperature=1.0), seed=7 + i)
            for i, p in enumerate(ids)]
    together = generate_all(engine, reqs)
    alone = generate_one_by_one(engine, reqs)
    assert [r.output_ids for r in together] == [r.output_ids for r in alone]
    other_seed = generate_one_by_one(engine, [GenerationRequest("x", ids[0], reqs[0].sampling, seed=8)])[0]
    assert other_seed.output_ids != together[0].output_ids


def test_max_tokens_stop_strings_and_stop_ids_are_honoured(engine):
    ids = prompts(engine)[2]
    free = generate_one_by_one(engine, [GenerationRequest("f", ids, SamplingParams(max_tokens=12, temperature=0))])[0]
    assert free.finish_reason == "length" and len(free.output_ids) == 12
    words = free.text.split()
    stop_word = words[2]
    cut = generate_one_by_one(engine, [GenerationRequest(
        "c", ids, SamplingParams(max_tokens=12, temperature=0, stop=(stop_word,)))])[0]
    assert cut.finish_reason == "stop" and stop_word not in cut.text
    assert free.text.startswith(cut.text) and len(cut.output_ids) < 12
    assert cut.output_ids == free.output_ids[: len(cut.output_ids)]  # the ids are the sampled ones, untrimmed
    stop_id = free.output_ids[3]
    by_id = generate_one_by_one(engine, [GenerationRequest(
        "i", ids, SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(stop_id,)))])[0]
    assert by_id.finish_reason == "stop" and by_id.output_ids[-1] == stop_id
    assert len(by_id.output_ids) == free.output_ids.index(stop_id) + 1


def test_eos_finishes_with_stop(engine):
    ids = prompts(engine)[0]
    res = generate_one_by_one(engine, [GenerationRequest("e", ids, SamplingParams(max_tokens=40, temperature=0))])[0]
    assert res.finish_reason == "stop" and res.output_ids[-1] in engine.eos_ids
    assert "5" in res.text and "<|im_end|>" not in res.text


def test_prompt_longer_than_context_fails_clearly(engine):
    too_long = [1] * (engine.context_length + 1)
    with pytest.raises(EngineError, match="context is 8192 tokens"):
        generate_one_by_one(engine, [GenerationRequest("l", too_long, SamplingParams(max_tokens=4))])


def test_second_load_reads_the_converted_cache(engine):
    from scaffold_core.engines.model_loading import load_model_and_tokenizer

    model, tokenizer, info = load_model_and_tokenizer(engine.source)
    assert info["cached"] is True
    assert tokenizer.encode("hello world") == engine.tokenizer.encode("hello world")
    first = next(iter(engine.model.state_dict().values()))
    again = next(iter(model.state_dict().values()))
    if engine.stats().get("packed_dtype") == "float16":  # the engine's linear weights are rounded to float16
        again = again.half().float()
    assert torch.equal(first, again)


def test_a_group_shares_one_prefill_and_matches_the_unshared_path(engine):
    first, second = prompts(engine)[:2]
    sampled = SamplingParams(max_tokens=6, temperature=1.0)
    greedy = SamplingParams(max_tokens=6, temperature=0)
    reqs = ([GenerationRequest(f"v{i}", list(first), sampled, seed=40 + i) for i in range(3)]
            + [GenerationRequest("vg", list(first), greedy), GenerationRequest("w", second, sampled, seed=50)])
    before = engine.stats()
    shared = generate_all(engine, reqs)
    after = engine.stats()
    assert after["batches"] - before["batches"] == 1  # requests arriving together share a batch
    assert after["shared_prefills"] - before["shared_prefills"] == 1  # the four rows of the first prompt
    assert after["prefills"] - before["prefills"] == 2
    assert after["prefill_rows_saved"] - before["prefill_rows_saved"] == 3
    engine.share_prefill = False
    try:
        unshared = generate_all(engine, reqs)
    finally:
        engine.share_prefill = True
    assert engine.stats()["prefills"] - after["prefills"] == len(reqs)
    for s, u in zip(shared, unshared):
        assert s.output_ids == u.output_ids and s.finish_reason == u.finish_reason
        assert max(abs(a - b) for a, b in zip(s.logprobs, u.logprobs)) <= 1e-4
    assert len({tuple(r.output_ids) for r in shared[:3]}) > 1  # each sample drew from its own seed


def test_prompts_sharing_a_long_start_prefill_it_once_and_match_teacher_forcing(engine):
    shots = [{"role": "user", "content": "What is 12 times 3? Think step by step."},
             {"role": "assistant", "content": "12 times 3 is 36. The answer is 36."}]
    ids = [render_chat(engine.tokenizer, shots + [{"role": "user", "content": q}])[1] for q in QUESTIONS]
    common = 0
    while all(p[common] == ids[0][common] for p in ids):
        common += 1
    greedy = SamplingParams(max_tokens=6, temperature=0)
    reqs = [GenerationRequest(f"f{i}", p, greedy) for i, p in enumerate(ids)]
    before = engine.stats()
    shared = generate_all(engine, reqs)
    after = engine.stats()
    assert after["batches"] - before["batches"] == 1
    # the start was computed once: the other prompts took its keys and values
    assert after["prefix_tokens_reused"] - before["prefix_tokens_reused"] == common * (len(ids) - 1)
    engine.share_prefill = False
    try:
        unshared = generate_all(engine, reqs)
    finally:
        engine.share_prefill = True
    for req, s, u in zip(reqs, shared, unshared):
        assert s.output_ids == u.output_ids
        expected = teacher_forced_logprobs(engine, req.prompt_ids, s.output_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(expected, s.logprobs)) <= 1e-3


def test_requests_joining_a_running_batch_match_running_alone(engine):
    story = render_chat(engine.tokenizer, [{"role": "user", "content": "Write a long story about a dragon."}])[1]
    ids = prompts(engine)
    longer = render_chat(engine.tokenizer, [{"role": "user", "content": " ".join(QUESTIONS * 2)}])[1]
    first = GenerationRequest("j0", story, SamplingParams(max_tokens=40, temperature=1.0), seed=11)
    # one joiner with a prompt longer than the running row's history, one shorter; sampled and greedy
    joiners = [GenerationRequest("j1", longer, SamplingParams(max_tokens=8, temperature=0.8), seed=12),
               GenerationRequest("j2", ids[1], SamplingParams(max_tokens=8, temperature=0))]
    assert len(longer) > len(story) + 3 > len(ids[1])

    async def together():
        loop = asyncio.get_running_loop()
        seen = loop.create_future()

        def on_token(token: int) -> None:  # the first row is decoding: send the others now
            if not seen.done():
                seen.set_result(None)

        running = asyncio.ensure_future(engine.generate(dataclasses.replace(first, on_token=on_token)))
        await seen
        late = await asyncio.gather(*(engine.generate(r) for r in joiners))
        return [await running, *late]

    before = engine.stats()
    joined = engine.runner.run(together())
    after = engine.stats()
    assert after["batches"] - before["batches"] == 1 and after["joined"] - before["joined"] == 2
    assert len(joined[0].output_ids) == 40  # still decoding when the others joined and left
    alone = generate_one_by_one(engine, [first, *joiners])
    for req, j, a in zip([first, *joiners], joined, alone):
        assert j.output_ids == a.output_ids and j.finish_reason == a.finish_reason
        assert max(abs(x - y) for x, y in zip(j.logprobs, a.logprobs)) <= 1e-3
        temperature = req.sampling.temperature or 1.0
        expected = teacher_forced_logprobs(engine, req.prompt_ids, j.output_ids, temperature)
        assert max(abs(x - y) for x, y in zip(expected, j.logprobs)) <= 1e-3
