"""Conformance tests for engines on inference servers (SGLang, vLLM): what RL needs beyond the engine contract.

Subclass :class:`RemoteEngineConformance` once against your plugin's protocol
test server and once against a live server (gated on an environment
variable): the same checks run on both, so a behaviour the test server
imitates is confirmed on the real one. Beyond :class:`EngineConformance`:

* ``max_tokens`` above a server's own default (vLLM's is 16) is honoured;
* top logprobs, when asked, hold the sampled token at each position;
* a ``keep`` pause keeps the requests in flight and holds new ones until the
  resume;
* a weight update mid-generation (``checkpoint``: a directory every server
  can read; the check is skipped without one) gives each token the version
  that sampled it, older tokens first;
* a prompt over the context is a clear error that is not retried.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from scaffold_core.errors import EngineError
from scaffold_core.sampling import SamplingParams

from .engines import SERVED, EngineConformance


class RemoteEngineConformance(EngineConformance):
    """Checks for a :class:`~scaffold_remote.engine.RemoteEngine` subclass (see the module docstring)."""

    #: A prompt whose greedy answer is longer than ``long_max_tokens``.
    long_prompt: ClassVar[str] = "Count from 1 to 200, separated by commas."
    #: A length above the servers' own default limit, which must never apply.
    long_max_tokens: ClassVar[int] = 40
    #: Requests sent at once for the weight-update check (at least one must still run when the update comes).
    update_requests: ClassVar[int] = 8
    #: Tokens each of those may generate.
    update_max_tokens: ClassVar[int] = 256

    #: A checkpoint directory every server can read (the served model saved with save_pretrained); a
    #: ``live_engine`` fixture of a test server may set it on the class (any directory will do there).
    _checkpoint: ClassVar[str | None] = None

    @property
    def checkpoint(self) -> str | None:
        """The directory the weight-update check loads (``None``: the check is skipped)."""
        return type(self)._checkpoint

    def test_max_tokens_above_the_servers_default_is_honoured(self, live_engine: Any) -> None:
        sampling = self.greedy(max_tokens=self.long_max_tokens)
        result = live_engine.generate(live_engine.request(self.long_prompt, sampling))
        self.check_result(result, sampling)
        assert result.finish_reason == "length" and len(result.output_ids) == self.long_max_tokens, (
            f"{len(result.output_ids)} tokens ({result.finish_reason}) for max_tokens={self.long_max_tokens}: was "
            "max_tokens sent?")

    def test_top_logprobs_hold_the_sampled_token(self, live_engine: Any) -> None:
        sampling = self.greedy(max_tokens=6, top_logprobs=3)
        result = live_engine.generate(live_engine.request(self.long_prompt, sampling))
        self.check_result(result, sampling)
        assert result.top_logprobs is not None and len(result.top_logprobs) == len(result.output_ids)
        for token, logprob, position in zip(result.output_ids, result.logprobs, result.top_logprobs):
            assert 1 <= len(position) <= 4 and all(v <= 1e-4 for v in position.values())
            assert token in position and abs(position[token] - logprob) < 1e-3

    def test_pause_keep_keeps_requests_and_holds_new_ones(self, live_engine: Any) -> None:
        engine = live_engine.engine
        sampling = self.greedy(max_tokens=self.update_max_tokens)

        async def pause_and_resume() -> tuple[bool, list[Any]]:
            running = [asyncio.ensure_future(engine.generate(live_engine.request(self.long_prompt, sampling)))
                       for _ in range(2)]
            await asyncio.sleep(0.05)
            await engine.pause_generation("keep")
            later = asyncio.ensure_future(engine.generate(live_engine.request(self.prompts[0], self.greedy())))
            try:
                await asyncio.sleep(0.3)
                held = not later.done()
            finally:
                await engine.continue_generation()
            return held, await asyncio.gather(*running, later)

        held, results = live_engine.run(pause_and_resume())
        assert held, "a request sent while paused was answered before the resume"
        assert all(r.finish_reason in SERVED for r in results), [r.finish_reason for r in results]

    def test_weight_update_mid_generation_gives_each_token_its_version(self, live_engine: Any) -> None:
        checkpoint = self.checkpoint
        if checkpoint is None:
            pytest.skip("no checkpoint directory the servers can read (set `checkpoint`)")
        engine = live_engine.engine
        sampling = SamplingParams(max_tokens=self.update_max_tokens, temperature=1.0)

        async def update_while_generating() -> tuple[int, int, list[Any], Any]:
            before = engine.weight_version
            running = [asyncio.ensure_future(engine.generate(live_engine.request(self.long_prompt, sampling,
                                                                                 seed=i)))
                       for i in range(self.update_requests)]
            await asyncio.sleep(0.05)
            mode, engine.pause_mode = engine.pause_mode, "abort"
            try:
                after = await engine.update_weights(checkpoint)
            finally:
                engine.pause_mode = mode
            later = await engine.generate(live_engine.request(self.prompts[0], self.greedy()))
            return before, after, await asyncio.gather(*running), later

        before, after, results, later = live_engine.run(update_while_generating())
        assert after == before + 1 and later.token_versions() == [after] * len(later.output_ids)
        split = [r for r in results if r.versions is not None and len(set(r.versions)) > 1]
        for result in results:
            self.check_result(result, sampling)
            versions = result.token_versions()
            assert versions == sorted(versions) and set(versions) <= {before, after}
        if not split:
            pytest.skip("every request finished before the update: nothing was generated across it")
        assert all(r.versions.count(before) and r.versions.count(after) for r in split)

    def test_context_overflow_is_a_clear_error_not_retried(self, live_engine: Any) -> None:
        limit = live_engine.engine.context_length
        if not limit:
            pytest.skip("the servers do not say their context length")
        with pytest.raises(EngineError) as info:
            live_engine.generate(live_engine.request([1] * 8, SamplingParams(max_tokens=limit + 10)))
        assert not info.value.retryable and "context" in str(info.value)
