"""One small check on the real model: a trace generated in chunks is the model's own sampling, token for token."""

from __future__ import annotations

import pytest

from scaffold_core.episode import EpisodeContext
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import render_chat
from scaffold_methods.traces import Trace


def test_chunks_concatenate_to_the_models_own_logprobs(smollm2_engine):
    torch = pytest.importorskip("torch")
    tokenizer = smollm2_engine.tokenizer
    messages = [{"role": "user", "content": "What is 7 + 5? Think step by step."}]
    text, ids = render_chat(tokenizer, messages)
    sampling = SamplingParams(max_tokens=12, temperature=0.7, seed=5, top_logprobs=3)
    ctx = EpisodeContext("smoke", 0, {}, ids, sampling, seed=5, prompt_text=text, messages=messages,
                         tokenizer=tokenizer)
    trace = Trace(0, 12)
    while not trace.done:
        task = trace.next_task(ctx, 4)
        task.result = smollm2_engine.generate(GenerationRequest(task.request_id, task.prompt_ids, task.sampling,
                                                                task.seed, "smoke"))
        trace.absorb(task, tokenizer)
    assert trace.calls >= 2 and len(trace.top_logprobs) == len(trace.output_ids) == len(trace.logprobs)
    model = smollm2_engine.engine.model
    with torch.inference_mode():
        logits = model(torch.tensor([ids + trace.output_ids])).logits[0].float()
    logp = torch.log_softmax(logits / 0.7, dim=-1)
    for j, token in enumerate(trace.output_ids):
        row = logp[len(ids) - 1 + j]
        assert abs(row[token].item() - trace.logprobs[j]) < 1e-3
        values, tokens = torch.topk(row, 3)
        assert sorted(trace.top_logprobs[j]) == sorted(tokens.tolist())
    sample = trace.to_sample(ctx)
    assert sample.text == tokenizer.decode(trace.output_ids, skip_special_tokens=True)
