"""SGLang as a teacher (``engine: sglang``): input-token logprobs against the SGLang test server, whose
ground truth is its backend's teacher-forced scores."""

from __future__ import annotations

import pytest
from sglang_testkit import byte_server, run, ts

from scaffold_core.teacher import make_teacher

PAIRS = [([40, 41, 42], [50, 51, 52, 53]), ([7, 8], [9]), ([60, 61, 62, 63], [70, 71])]


@pytest.mark.parametrize("top_k", [0, 3])
def test_an_sglang_teacher_gives_the_servers_teacher_forced_logprobs_in_one_batched_request(top_k):
    server = byte_server()

    async def main():
        async with ts.running(server) as url:
            teacher = make_teacher({"engine": "sglang", "url": url, "tokenizer": "builtin:byte", "top_k": top_k})
            await teacher.start()
            try:
                return await teacher.score_batch(PAIRS), teacher
            finally:
                await teacher.close()

    scores, teacher = run(main())
    for (prompt, completion), s in zip(PAIRS, scores):
        expected = server.backend.prompt_logprobs(prompt + completion, top_k)[len(prompt):]
        assert s.logprobs == [e[0] for e in expected]
        if top_k:
            assert s.top_logprobs == [dict(e[1]) for e in expected]
        else:
            assert s.top_logprobs is None
    assert teacher.stats.calls == 1 and teacher.stats.scored_tokens == 7 and teacher.requests == 1
    assert all(r["output_ids"] == [] for r in server.responses)  # nothing generated: scoring only
