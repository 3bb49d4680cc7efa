"""Chunked generation: concatenated calls are token-faithful, inserted tokens are masked, split stops found."""

from __future__ import annotations

import asyncio

from methods_testkit import CONFIDENT_LP, ScriptEngine

from scaffold_core.episode import EpisodeContext
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import ByteTokenizer, render_chat
from scaffold_core.trajectory import sample_tokens
from scaffold_methods.traces import Trace

TOK = ByteTokenizer()


def context(sampling: SamplingParams) -> EpisodeContext:
    messages = [{"role": "user", "content": "Q"}]
    text, ids = render_chat(TOK, messages)
    return EpisodeContext("ep", 0, {"question": "Q"}, ids, sampling, seed=1, prompt_text=text, messages=messages,
                          tokenizer=TOK)


def drive(engine, trace, ctx, chunk, sampling=None):
    async def go():
        while not trace.done:
            task = trace.next_task(ctx, chunk, sampling)
            task.result = await engine.generate(_request(task, ctx))
            trace.absorb(task, ctx.tokenizer)
    asyncio.run(go())


def _request(task, ctx):
    from scaffold_core.generation import GenerationRequest

    return GenerationRequest(task.request_id, task.prompt_ids, task.sampling, task.seed, ctx.episode_id)


def test_chunks_concatenate_to_the_single_call_response():
    engine = ScriptEngine(lambda q, i: "The sum is 12.\n#### 12")
    ctx = context(SamplingParams(max_tokens=64))
    trace = Trace(0, 64)
    drive(engine, trace, ctx, 5)
    single = Trace(0, 64)
    drive(engine, single, ctx, 64)
    assert trace.calls == 5 and single.calls == 1
    assert trace.output_ids == single.output_ids and trace.logprobs == single.logprobs
    assert trace.output_ids[-1] == TOK.eos_token_id and trace.finish_reason == "stop"
    sample = trace.to_sample(ctx)
    assert sample.text == "The sum is 12.\n#### 12" == single.to_sample(ctx).text
    assert sample.output_mask == [1] * len(sample.output_ids) and sample.metadata["engine_calls"] == 5
    # each call's prompt was the episode's prompt plus every id generated before it
    prompts = [r.prompt_ids for r in engine.requests[:5]]
    assert all(p[: len(ctx.prompt_ids)] == ctx.prompt_ids for p in prompts)
    assert [len(p) - len(ctx.prompt_ids) for p in prompts] == [0, 5, 10, 15, 20]


def test_the_trace_limit_ends_with_length():
    engine = ScriptEngine(lambda q, i: "x" * 50)
    ctx = context(SamplingParams(max_tokens=12))
    trace = Trace(0, 12)
    drive(engine, trace, ctx, 5)
    assert trace.length == 12 and trace.finish_reason == "length" and [r.sampling.max_tokens for r in
                                                                         engine.requests] == [5, 5, 2]


def test_inserted_tokens_are_context_never_loss_tokens():
    engine = ScriptEngine(lambda q, i: "abcdef")
    ctx = context(SamplingParams(max_tokens=4))
    trace = Trace(0, 4)
    drive(engine, trace, ctx, 4)
    trace.insert(TOK.encode(" probe"))
    sample = trace.to_sample(ctx)
    ids, mask, logprobs, versions = sample_tokens(sample)
    n = len(ctx.prompt_ids)
    assert mask[n:] == [1, 1, 1, 1] + [0] * 6
    assert logprobs[n:] == [CONFIDENT_LP] * 4 + [0.0] * 6
    assert versions[n + 4:] == [-1] * 6
    assert sample.text == "abcd probe"
    assert trace.length == 4


def test_a_stop_string_split_across_calls_is_found():
    engine = ScriptEngine(lambda q, i: "step one END more text")
    sampling = SamplingParams(max_tokens=64, stop=("END",))
    ctx = context(sampling)
    trace = Trace(0, 64)
    drive(engine, trace, ctx, 10)  # "step one E" | "ND more te": the stop straddles the calls
    assert trace.finish_reason == "stop"
    assert TOK.decode(trace.output_ids) == "step one END"  # cut after the token completing the stop
    assert trace.generated == 20  # the tokens generated past it still count as generated
    assert trace.to_sample(ctx).text == "step one "
    # one call finds it itself
    single = Trace(0, 64)
    drive(engine, single, ctx, 64)
    assert single.output_ids == trace.output_ids


def test_only_a_stop_string_straddling_the_calls_cuts_them():
    engine = ScriptEngine(lambda q, i: "a\n\nb c")
    ctx = context(SamplingParams(max_tokens=64))
    stop_pair = SamplingParams(max_tokens=64, stop=("\n\n",))
    trace = Trace(0, 64)
    drive(engine, trace, ctx, 2, stop_pair)  # "a\n" | "\nb": the pair straddles, cut after its second newline
    assert TOK.decode(trace.output_ids) == "a\n\n" and trace.finish_reason == "stop"
    # a step that ended on its own stop string (tree search resumes it): the next call is not cut by it
    steps = ScriptEngine(lambda q, i: "a\n\nbc\n\nd")
    trace = Trace(0, 64)
    drive(steps, trace, ctx, 64, stop_pair)
    assert TOK.decode(trace.output_ids) == "a\n\n"
    trace.finish_reason = None
    drive(steps, trace, ctx, 64, stop_pair)
    assert TOK.decode(trace.output_ids) == "a\n\nbc\n\n"


def test_a_weight_update_between_chunks_gives_each_token_the_version_that_sampled_it():
    class Updating(ScriptEngine):
        def result_for(self, text, request):
            result = super().result_for(text, request)
            result.weight_version = len(self.requests) // 2  # new weights every second call
            return result

    engine = Updating(lambda q, i: "abcdefghij")
    ctx = context(SamplingParams(max_tokens=12))
    trace = Trace(0, 12)
    drive(engine, trace, ctx, 3)
    trace.insert(TOK.encode("!"))
    sample = trace.to_sample(ctx)
    assert sample.weight_version == 0  # the oldest that sampled any of its tokens
    assert sample.versions == [0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, -1]  # "abc" "def" "ghi" "j"+EOS, the insert


def test_an_engine_that_names_no_version_leaves_the_sample_without_versions():
    class Unversioned(ScriptEngine):
        def result_for(self, text, request):
            result = super().result_for(text, request)
            result.weight_version = None
            return result

    engine = Unversioned(lambda q, i: "abcdef")
    ctx = context(SamplingParams(max_tokens=8))
    trace = Trace(0, 8)
    drive(engine, trace, ctx, 4)
    sample = trace.to_sample(ctx)
    assert sample.weight_version is None and sample.versions is None
