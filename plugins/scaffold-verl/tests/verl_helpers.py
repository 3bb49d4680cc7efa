"""Helpers shared by the scaffold-verl tests: backends (fake verl, or the real one when installed), scripts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import fake_verl
import pytest
from scaffold_testkit.replies import EOS, TOKENIZER

PROMPT_LENGTH, RESPONSE_LENGTH = 256, 128
MESSAGES = [{"role": "user", "content": "What is 40 + 2?"}]
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def backend(kind: str) -> SimpleNamespace:
    """verl's classes and the agent loop class under test, for ``fake`` or ``real`` verl."""
    from scaffold_verl.loop import ScaffoldLoop

    if kind == "real":
        pytest.importorskip("verl", reason="verl is not installed (pip install 'scaffold-verl[verl]')")
        from scaffold_verl.agent_loop import ScaffoldAgentLoop

        return SimpleNamespace(kind=kind, classes=fake_verl.real_classes(), loop_cls=ScaffoldAgentLoop)
    cls = type("FakeScaffoldAgentLoop", (ScaffoldLoop, fake_verl.AgentLoopBase), {"verl": fake_verl.api()})
    return SimpleNamespace(kind=kind, classes=fake_verl.fake_classes(), loop_cls=cls)


def server(be: SimpleNamespace, respond: Callable[[list[int]], list[int]], **options: Any) -> Any:
    options.setdefault("prompt_length", PROMPT_LENGTH)
    options.setdefault("response_length", RESPONSE_LENGTH)
    return fake_verl.FakeServerManager(respond, eos_token_id=EOS, classes=be.classes, **options)


def run_loop(be: SimpleNamespace, srv: Any, entry: dict[str, Any] | None = None, *, sampling: dict | None = None,
             row: dict[str, Any] | None = None, response_length: int = RESPONSE_LENGTH, runs: int = 1) -> list[Any]:
    """Instantiate the loop as verl's worker does (per sample), run it ``runs`` times, close the shared machinery."""
    from scaffold_verl.loop import close_shared

    entry = {"name": "scaffold_agent", **(entry or {})}
    config = fake_verl.trainer_config(PROMPT_LENGTH, response_length)
    kwargs = row or {"raw_prompt": list(MESSAGES), "reward_model": {"style": "rule", "ground_truth": "42"},
                     "data_source": "gsm8k", "extra_info": {"index": 7}, "index": 7, "uid": "u-7",
                     "tools_kwargs": {}, "interaction_kwargs": {}}

    async def main() -> list[Any]:
        outputs = []
        try:
            for i in range(runs):
                loop = fake_verl.instantiate(be.classes, entry, server=srv, tokenizer=TOKENIZER, config=config,
                                             target_cls=be.loop_cls)
                params = dict(sampling or SAMPLING)
                outputs.append(await loop.run(params, priority=i, **kwargs))
                assert params == dict(sampling or SAMPLING), "run must not change verl's sampling_params"
        finally:
            await close_shared()
        return outputs

    return asyncio.run(main())


def prompt_ids(messages: Sequence[dict[str, Any]] = MESSAGES) -> list[int]:
    return TOKENIZER.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=True)


def logprobs_of(tokens: Sequence[int], start: int, steps: Sequence[int]) -> list[float]:
    return [fake_verl.token_logprob(t, start + i, s) for i, (t, s) in enumerate(zip(tokens, steps))]


def padded(be: SimpleNamespace, output: Any, response_length: int = RESPONSE_LENGTH) -> dict[str, Any]:
    return fake_verl.postprocess(output, prompt_length=PROMPT_LENGTH, response_length=response_length,
                                 pad_token_id=TOKENIZER.pad_token_id)
