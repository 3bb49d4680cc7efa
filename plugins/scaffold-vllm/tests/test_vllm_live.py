"""Checks against a real vLLM server: they run only when SCAFFOLD_VLLM_URL is set.

    SCAFFOLD_VLLM_URL=http://127.0.0.1:8000 pytest plugins/scaffold-vllm/tests/test_vllm_live.py

(``VLLM_API_KEY`` too if the server was started with ``--api-key``.) They
confirm on a live server what the protocol tests assume from vLLM's source:
one logprob per output id, the generate endpoint and ``/v1/completions``
agreeing on greedy tokens and their logprobs, vLLM's 16-token default when
``max_tokens`` is left out (which the engine never does), and an unknown
sampling key dropped without a word (which the engine never sends). The
conformance kit's live class (``test_vllm_conformance.py``) checks the rest;
``bench/gpu_engines.py`` runs both on a one-GPU machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request

import pytest
from scaffold_vllm import VLLMEngine

from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import render_chat

URL = os.environ.get("SCAFFOLD_VLLM_URL")
pytestmark = pytest.mark.skipif(not URL, reason="set SCAFFOLD_VLLM_URL to run against a real vLLM server")
COUNT = [{"role": "user", "content": "Count from 1 to 200, separated by commas."}]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 600))


def post(path: str, body: dict) -> tuple[int, dict]:
    """A raw POST (no scaffold client), so a mistake in the client cannot hide one in the server."""
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['VLLM_API_KEY']}"
    request = urllib.request.Request(URL.rstrip("/") + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def greedy(eng: VLLMEngine, max_tokens: int) -> GenerationRequest:
    _, ids = render_chat(eng.tokenizer, COUNT)
    return GenerationRequest("g", ids, SamplingParams(max_tokens=max_tokens, temperature=0))


def test_live_generate_is_token_faithful_and_agrees_with_completions():
    async def main():
        async with VLLMEngine(url=URL, url_wait_timeout=60) as eng:
            short = await eng.generate(greedy(eng, 8))
            long = await eng.generate(greedy(eng, 48))
        async with VLLMEngine(url=URL, url_wait_timeout=60, api="completions") as other:
            via_completions = await other.generate(greedy(other, 48))
        return eng, short, long, via_completions

    eng, short, long, completions = run(main())
    assert eng.endpoint == "/inference/v1/generate", "this vLLM has no token endpoint: the engine falls back"
    assert len(short.output_ids) == len(short.logprobs) == 8 and short.finish_reason == "length"
    assert all(lp <= 0.0 for lp in short.logprobs) and short.weight_version == 0
    assert long.output_ids[:8] == short.output_ids and len(long.output_ids) == 48  # max_tokens above 16 honoured
    assert completions.output_ids == long.output_ids
    assert max(abs(a - b) for a, b in zip(completions.logprobs, long.logprobs)) < 0.05


def test_live_vllm_defaults_max_tokens_to_16_which_the_engine_never_leaves_to_it():
    async def prompt_ids():
        async with VLLMEngine(url=URL, url_wait_timeout=60) as eng:
            return greedy(eng, 1).prompt_ids

    ids = run(prompt_ids())
    status, body = post("/inference/v1/generate", {"token_ids": ids, "sampling_params": {"temperature": 0,
                                                                                         "logprobs": 0}})
    assert status == 200, body
    assert len(body["choices"][0]["token_ids"]) <= 16  # what a client that omits max_tokens gets


def test_live_vllm_drops_an_unknown_sampling_key_without_a_word():
    async def prompt_ids():
        async with VLLMEngine(url=URL, url_wait_timeout=60) as eng:
            return greedy(eng, 1).prompt_ids

    ids = run(prompt_ids())
    status, body = post("/inference/v1/generate", {"token_ids": ids, "sampling_params": {
        "max_tokens": 2, "temperature": 0, "max_new_tokens": 50, "logprobs": 0}})
    assert status == 200 and len(body["choices"][0]["token_ids"]) == 2, body  # max_new_tokens was ignored
