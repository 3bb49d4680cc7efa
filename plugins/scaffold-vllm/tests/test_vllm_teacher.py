"""vLLM as a teacher: prompt logprobs (``engine: vllm``) and the OpenAI-compatible echo (``engine: openai``)
against the vLLM test server, whose ground truth is its backend's teacher-forced scores."""

from __future__ import annotations

import pytest
from vllm_testkit import byte_server, run, ts

from scaffold_core.teacher import make_teacher

PAIRS = [([40, 41, 42], [50, 51, 52, 53]), ([7, 8], [9]), ([60, 61, 62, 63], [70, 71]),
         ([40, 41, 42], [50, 51, 52, 99])]


def truth(server, prompt, completion, top=0):
    scored = server.backend.prompt_logprobs(list(prompt) + list(completion), top)
    return scored[len(prompt):]


@pytest.mark.parametrize("engine", ["vllm", "openai"])
def test_a_vllm_teacher_gives_the_servers_teacher_forced_logprobs_in_batched_requests(engine):
    server = byte_server()

    async def main():
        async with ts.running(server) as url:
            teacher = make_teacher({"engine": engine, "url": url, "tokenizer": "builtin:byte", "max_batch_size": 3,
                                    "top_k": 2})
            await teacher.start()
            try:
                return await teacher.score_batch(PAIRS), teacher
            finally:
                await teacher.close()

    scores, teacher = run(main())
    for (prompt, completion), s in zip(PAIRS, scores):
        expected = truth(server, prompt, completion, 2)
        assert s.logprobs == [e[0] for e in expected]
        assert s.top_logprobs is not None and len(s.top_logprobs) == len(completion)
        for token, top, e in zip(completion, s.top_logprobs, expected):  # the 2 most likely of token + top 2
            assert top == dict(sorted([(token, e[0]), *e[1]], key=lambda kv: -kv[1])[:2]) or engine == "openai"
    # Batched: 4 sequences in requests of at most 3 (two requests); counted apart from the student's generation.
    assert len(server.bodies) == 2 and [len(b["prompt"]) for b in server.bodies] == [3, 1]
    assert teacher.stats.calls == 1 and teacher.stats.samples == 4
    assert teacher.stats.scored_tokens == sum(len(c) for _, c in PAIRS)
    assert teacher.stats.tokens == sum(len(p) + len(c) for p, c in PAIRS) and teacher.stats.seconds > 0
    body = server.bodies[0]
    if engine == "vllm":
        assert body["prompt_logprobs"] == 2 and "echo" not in body
    else:
        assert body["echo"] is True and body["logprobs"] == 2
    assert server.ignored_fields == []


def test_a_server_that_does_not_return_prompt_logprobs_is_a_clear_error(monkeypatch):
    server = byte_server()
    monkeypatch.setattr(server.backend, "prompt_logprobs", lambda ids, top=0: [None])

    async def main():
        async with ts.running(server) as url:
            teacher = make_teacher({"engine": "vllm", "url": url, "tokenizer": "builtin:byte"})
            await teacher.start()
            try:
                await teacher.score_batch(PAIRS[:1])
            finally:
                await teacher.close()

    with pytest.raises(ValueError, match="does not return prompt logprobs"):
        run(main())


def test_server_errors_name_the_teacher_and_the_servers_message():
    async def main():
        async with ts.running(byte_server()) as url:
            teacher = make_teacher({"engine": "vllm", "url": url, "tokenizer": "builtin:byte", "model": "other"})
            await teacher.start()
            try:
                await teacher.score_batch(PAIRS[:1])
            finally:
                await teacher.close()

    with pytest.raises(RuntimeError, match=r"teacher at http://.*/v1/completions: HTTP 404: .*other"):
        run(main())
