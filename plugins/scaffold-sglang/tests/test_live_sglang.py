"""Checks against a real SGLang server: they run only when SCAFFOLD_SGLANG_URL is set.

    SCAFFOLD_SGLANG_URL=http://127.0.0.1:30000 pytest plugins/scaffold-sglang/tests/test_live_sglang.py

(``SGLANG_API_KEY`` too if the server was started with ``--api-key``.) They
confirm on a live server what the protocol tests assume from SGLang's source:
one logprob per output id, a matched EOS kept in the ids, max_new_tokens
honoured, unknown sampling keys refused.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_sglang import SGLangEngine

URL = os.environ.get("SCAFFOLD_SGLANG_URL")
pytestmark = pytest.mark.skipif(not URL, reason="set SCAFFOLD_SGLANG_URL to run against a real SGLang server")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def test_live_generate_is_token_faithful():
    async def main():
        async with SGLangEngine(url=URL, url_wait_timeout=30) as eng:
            from scaffold_core.tokenizers import render_chat

            _, ids = render_chat(eng.tokenizer, [{"role": "user", "content": "Count from 1 to 20."}])
            short = await eng.generate(GenerationRequest("a", ids, SamplingParams(max_tokens=8, temperature=0)))
            free = await eng.generate(GenerationRequest("b", ids, SamplingParams(max_tokens=256, temperature=0)))
            return eng, short, free

    eng, short, free = run(main())
    assert len(short.output_ids) == len(short.logprobs) <= 8
    assert short.finish_reason in ("length", "stop") and short.weight_version is not None
    assert all(lp <= 0.0 for lp in short.logprobs)
    assert free.output_ids[:len(short.output_ids)] == short.output_ids  # greedy is deterministic
    if free.finish_reason == "stop" and isinstance(free.meta.get("matched"), int):
        assert free.output_ids[-1] == free.meta["matched"]  # the matched EOS is kept in the ids


def test_live_server_refuses_an_unknown_sampling_key():
    import aiohttp

    async def main():
        headers = {}
        if os.environ.get("SGLANG_API_KEY"):
            headers["Authorization"] = f"Bearer {os.environ['SGLANG_API_KEY']}"
        async with aiohttp.ClientSession(headers=headers) as session:
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "seed": 1}}
            async with session.post(URL.rstrip("/") + "/generate", data=json.dumps(body)) as resp:
                return resp.status, await resp.text()

    status, text = run(main())
    assert status in (400, 500), text  # 0.5.23: 400 from the contract gate; 0.5.8-0.5.15: 500


def test_live_context_overflow_is_a_clear_non_retryable_error():
    async def main():
        async with SGLangEngine(url=URL, url_wait_timeout=30) as eng:
            limit = eng.context_length or 1 << 20
            with pytest.raises(EngineError) as info:
                await eng.generate(GenerationRequest("c", [1] * 8, SamplingParams(max_tokens=limit + 10)))
            return info.value

    error = run(main())
    assert not error.retryable and "context length" in str(error)
