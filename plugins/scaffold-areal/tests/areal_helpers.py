"""Helpers shared by the scaffold-areal tests: backends (fake AReaL, or the real one when installed), scripts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import fake_areal
import pytest
from scaffold_testkit.replies import EOS, TOKENIZER

QUESTION = {"messages": [{"role": "user", "content": "What is 40 + 2?"}], "answer": "42"}


def backend(kind: str) -> SimpleNamespace:
    """The AReaL classes, the adapter's API object and a workflow class, for ``fake`` or ``real`` AReaL."""
    from scaffold_areal.rollout import ScaffoldRollout

    if kind == "real":
        pytest.importorskip("areal", reason="AReaL is not installed (pip install 'scaffold-areal[areal]')")
        from scaffold_areal.workflow import ScaffoldWorkflow

        return SimpleNamespace(kind=kind, classes=fake_areal.real_classes(), workflow_cls=ScaffoldWorkflow)
    cls = type("FakeScaffoldWorkflow", (ScaffoldRollout, fake_areal.RolloutWorkflow), {"areal": fake_areal.api()})
    return SimpleNamespace(kind=kind, classes=fake_areal.fake_classes(), workflow_cls=cls)


def engine(be: SimpleNamespace, respond: Callable[[list[int]], list[int]], **options: Any) -> Any:
    return fake_areal.FakeInferenceEngine(respond, eos_token_id=EOS, classes=be.classes, **options)


def workflow(be: SimpleNamespace, **options: Any) -> Any:
    gconfig = options.pop("gconfig", None) or be.classes.GenerationHyperparameters(max_new_tokens=64, max_tokens=4096)
    options.setdefault("verifier", "gsm8k")
    return be.workflow_cls(gconfig=gconfig, tokenizer=TOKENIZER, **options)


def run(wf: Any, eng: Any, data: dict[str, Any] = QUESTION) -> Any:
    async def main() -> Any:
        try:
            return await wf.arun_episode(eng, data)
        finally:
            await wf.aclose()

    return asyncio.run(main())


def prompt_ids(messages: Sequence[dict[str, Any]] = QUESTION["messages"]) -> list[int]:
    return TOKENIZER.encode(TOKENIZER.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True))


def logprobs_of(tokens: Sequence[int], start: int, versions: Sequence[int]) -> list[float]:
    """What the fake server's policy gave ``tokens`` sampled from position ``start`` on under ``versions``."""
    return [fake_areal.token_logprob(t, start + i, v) for i, (t, v) in enumerate(zip(tokens, versions))]
