"""Conformance tests for engines: ids and logprobs agree, max_tokens and stop honoured, finish reasons valid."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from scaffold_core.generation import GenerationResult
from scaffold_core.sampling import SamplingParams

from ._common import ComponentConformance, least_block

#: Finish reasons of a request that was served (``abort`` means the engine failed it).
SERVED = ("stop", "length")


class EngineConformance(ComponentConformance):
    """Subclass this in your plugin's tests to check an engine against the engine contract.

    Set ``name``/``plugin`` (or override :meth:`make_engine`). The engine is
    started once per test class on a background event loop (the
    ``live_engine`` fixture); to reuse an engine your session already started,
    override that fixture::

        class TestMyEngine(EngineConformance):
            plugin = scaffold_myengine
            name = "myengine"

        class TestSharedModel(EngineConformance):
            name = "transformers"

            @pytest.fixture(scope="class")
            @classmethod
            def live_engine(cls, smollm2_engine):
                return smollm2_engine

    The stop and max_tokens checks compare against a greedy (temperature 0)
    reference generation, so they assume greedy decoding is deterministic;
    set ``deterministic_greedy = False`` for an engine where it is not.
    """

    kind: ClassVar[str] = "engine"
    #: User messages sent to the engine; the last should make a long answer.
    prompts: ClassVar[Sequence[str]] = (
        "What is 2 + 2? Answer with one number.",
        "Name three colours.",
        "Count from one to twenty in words, separated by commas.",
    )
    #: Tokens generated per request (keep it small for real models).
    max_tokens: ClassVar[int] = 16
    #: Seconds ``start()`` may take, and seconds one request (or one batch of them) may take.
    start_timeout: ClassVar[float] = 600.0
    request_timeout: ClassVar[float] = 300.0
    #: Whether temperature 0 always picks the same tokens for the same prompt.
    deterministic_greedy: ClassVar[bool] = True
    #: Whether greedy outputs are the same when requests run together (batched) as alone.
    batch_invariant: ClassVar[bool] = True
    #: Whether a seeded sampled request (temperature > 0) is reproducible.
    seeded_sampling: ClassVar[bool] = True
    #: Seconds a cancelled request (a timeout) may take to let go.
    cancel_timeout: ClassVar[float] = 10.0

    def make_engine(self) -> Any:
        """A new, unstarted engine (default: built by ``name`` through the registry)."""
        return self.build()

    # -- fixtures --------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def live_engine(cls) -> Any:
        """The engine under test, started once for the class on a background event loop."""
        from ..live import LiveEngine

        live = LiveEngine.start(cls().make_engine(), start_timeout=cls.start_timeout, timeout=cls.request_timeout)
        yield live
        live.close()

    @pytest.fixture(scope="class")
    @classmethod
    def greedy_alone(cls, live_engine: Any) -> list[GenerationResult]:
        """A greedy generation of each prompt, one request at a time (shared by the checks of a class)."""
        return [live_engine.generate(live_engine.request(p, cls.greedy())) for p in cls.prompts]

    @pytest.fixture(scope="class")
    @classmethod
    def greedy_reference(cls, greedy_alone: list[GenerationResult]) -> GenerationResult:
        """The greedy generation of the last prompt: the reference the stop and length checks cut."""
        return greedy_alone[-1]

    @classmethod
    def greedy(cls, **changes: Any) -> SamplingParams:
        return SamplingParams(max_tokens=cls.max_tokens, temperature=0.0, seed=0).replace(**changes)

    @staticmethod
    def check_result(result: Any, sampling: SamplingParams) -> None:
        """The contract every served result meets."""
        assert isinstance(result, GenerationResult), f"generate returned {type(result).__name__}"
        result.check()
        assert result.finish_reason in SERVED, f"finish_reason {result.finish_reason!r} for a served request"
        assert result.output_ids, "a served request produced no tokens"
        assert len(result.output_ids) <= sampling.max_tokens, (
            f"{len(result.output_ids)} tokens for max_tokens={sampling.max_tokens}")
        if result.finish_reason == "length":
            assert len(result.output_ids) == sampling.max_tokens, "finish 'length' before max_tokens was reached"
        assert all(isinstance(t, int) and t >= 0 for t in result.output_ids), "output ids must be ints >= 0"
        for lp in result.logprobs:
            assert isinstance(lp, float) and math.isfinite(lp) and lp <= 1e-4, \
                f"logprob {lp!r} is not a log-probability"
        assert isinstance(result.text, str)

    # -- tests -----------------------------------------------------------
    def test_tokenizer_renders_chat(self, live_engine: Any) -> None:
        """After ``start()`` the engine has a tokenizer whose chat template renders prompts."""
        assert live_engine.tokenizer is not None, "engine.tokenizer must be set after start()"
        ids = live_engine.prompt_ids(self.prompts[0])
        assert ids and all(isinstance(t, int) for t in ids)

    def test_ids_and_logprobs_agree(self, greedy_alone: list[GenerationResult]) -> None:
        """One logprob per output id, a valid finish reason, at most ``max_tokens`` tokens."""
        for result in greedy_alone:
            self.check_result(result, self.greedy())

    def test_max_tokens_is_honoured(self, live_engine: Any) -> None:
        """``max_tokens`` caps the output; ``finish_reason`` is ``length`` exactly when it cut it."""
        for n in (1, 2):
            sampling = self.greedy(max_tokens=n)
            result = live_engine.generate(live_engine.request(self.prompts[-1], sampling))
            self.check_result(result, sampling)

    def test_max_tokens_cut_is_a_prefix(self, live_engine: Any, greedy_reference: GenerationResult) -> None:
        """A greedy request cut at 3 tokens returns the first 3 tokens of the uncut one, finish ``length``."""
        if not self.deterministic_greedy:
            pytest.skip("deterministic_greedy is False")
        ref = greedy_reference
        if len(ref.output_ids) < 4:
            pytest.skip("the reference generation is too short to cut; use a prompt with a longer answer")
        sampling = self.greedy(max_tokens=3)
        result = live_engine.generate(live_engine.request(self.prompts[-1], sampling))
        self.check_result(result, sampling)
        assert result.output_ids == ref.output_ids[:3]
        assert result.finish_reason == "length"

    def test_stop_token_ids_are_honoured(self, live_engine: Any, greedy_reference: GenerationResult) -> None:
        """Generation ends at the first stop token id, which is included in ``output_ids``; finish ``stop``."""
        if not self.deterministic_greedy:
            pytest.skip("deterministic_greedy is False")
        ref = greedy_reference.output_ids
        candidates = [k for k in range(1, len(ref) - 1) if ref[k] not in ref[:k]]
        if not candidates:
            pytest.skip("no token of the reference generation can serve as a stop token")
        k = candidates[len(candidates) // 2]
        sampling = self.greedy(stop_token_ids=(ref[k],))
        result = live_engine.generate(live_engine.request(self.prompts[-1], sampling))
        self.check_result(result, sampling)
        assert result.output_ids == ref[: k + 1], f"expected to stop at token {ref[k]} (position {k})"
        assert result.finish_reason == "stop"

    def test_stop_strings_are_honoured(self, live_engine: Any, greedy_reference: GenerationResult) -> None:
        """Generation ends at a stop string; ``text`` ends before it; finish ``stop``."""
        if not self.deterministic_greedy:
            pytest.skip("deterministic_greedy is False")
        text = greedy_reference.text
        stop = _pick_stop_string(text)
        if stop is None:
            pytest.skip(f"the reference text {text!r} has no usable stop string")
        at = text.find(stop)
        sampling = self.greedy(stop=(stop,))
        result = live_engine.generate(live_engine.request(self.prompts[-1], sampling))
        self.check_result(result, sampling)
        assert result.finish_reason == "stop", f"stop string {stop!r} not honoured: {result.text!r}"
        assert stop not in result.text
        assert result.text == text[:at], f"with stop {stop!r}: {result.text!r}, expected {text[:at]!r}"
        assert len(result.output_ids) <= len(greedy_reference.output_ids)

    def test_concurrent_requests(self, live_engine: Any, greedy_alone: list[GenerationResult]) -> None:
        """Requests sent at once are each answered correctly (the same as alone, for greedy)."""
        sampling = self.greedy()
        results = live_engine.generate_many([live_engine.request(p, sampling) for p in self.prompts])
        assert len(results) == len(self.prompts)
        for result in results:
            self.check_result(result, sampling)
        if self.deterministic_greedy and self.batch_invariant:
            for prompt, together, alone in zip(self.prompts, results, greedy_alone):
                assert together.output_ids == alone.output_ids, (
                    f"prompt {prompt!r} got different greedy tokens in a batch than alone")

    def test_seeded_sampling_is_reproducible(self, live_engine: Any) -> None:
        """Two sampled requests with the same seed return the same tokens."""
        if not self.seeded_sampling:
            pytest.skip("seeded_sampling is False")
        sampling = SamplingParams(max_tokens=min(self.max_tokens, 8), temperature=1.0, seed=1234)
        first = live_engine.generate(live_engine.request(self.prompts[1], sampling, seed=99))
        second = live_engine.generate(live_engine.request(self.prompts[1], sampling, seed=99))
        self.check_result(first, sampling)
        assert first.output_ids == second.output_ids

    def test_close_before_start_is_safe(self) -> None:
        """``close()`` on an engine that never started, twice, does not raise."""
        engine = self.make_engine()

        async def close_twice() -> None:
            await asyncio.wait_for(engine.close(), 60)
            await asyncio.wait_for(engine.close(), 60)

        asyncio.run(close_twice())


    # -- what the built-ins guarantee: a free event loop, cancellable requests, no class-level state ------
    def test_does_not_block_the_event_loop(self, live_engine: Any) -> None:
        """While requests are served, the event loop is never held more than ``max_loop_block`` seconds at a
        time: the engine shares the loop with every episode, the runtime's timeouts and the other requests."""
        from ..live import LoopLagMonitor

        sampling = self.greedy()

        async def serve() -> float:
            async with LoopLagMonitor() as lag:
                await asyncio.gather(*(live_engine.engine.generate(live_engine.request(p, sampling))
                                       for p in self.prompts))
                await live_engine.engine.generate(live_engine.request(self.prompts[0], sampling))
            return lag.max_block

        blocked = least_block(lambda: live_engine.run(serve()), self.max_loop_block)
        assert blocked <= self.max_loop_block, (
            f"the engine held the event loop for {blocked:.3f} s at once while generating (bound: max_loop_block = "
            f"{self.max_loop_block:g} s): every episode, timeout and other request waits meanwhile. Run blocking "
            "work off the loop (await asyncio.to_thread(...), a thread pool, an async HTTP client) and never call "
            "time.sleep or a synchronous client inside async methods")

    def test_cancelled_request_lets_go_promptly(self, live_engine: Any) -> None:
        """A request cancelled mid-way (a timeout does that) ends within ``cancel_timeout`` seconds, and the
        engine then serves the next request normally."""
        sampling = self.greedy(max_tokens=max(self.max_tokens, 8))

        async def cancel_one() -> tuple[bool, float]:
            loop = asyncio.get_running_loop()
            task = asyncio.ensure_future(live_engine.engine.generate(live_engine.request(self.prompts[-1], sampling)))
            await asyncio.sleep(0.01)
            task.cancel()
            started = loop.time()
            await asyncio.wait({task}, timeout=self.cancel_timeout)
            return task.done(), loop.time() - started

        done, took = live_engine.run(cancel_one(), timeout=self.cancel_timeout + 30)
        assert done, (f"a cancelled request was still running after {self.cancel_timeout:g} s: request timeouts "
                      "cannot free it. Let asyncio.CancelledError propagate out of generate() (never swallow it)")
        result = live_engine.generate(live_engine.request(self.prompts[0], self.greedy()))
        self.check_result(result, self.greedy())

    def test_generation_leaves_class_state_unchanged(self, live_engine: Any) -> None:
        """Generating changes no class-level container of the engine's classes."""
        sampling = self.greedy()
        self.assert_class_state_unchanged(
            live_engine.engine, lambda: live_engine.generate(live_engine.request(self.prompts[0], sampling)),
            "generate()")


def _pick_stop_string(text: str) -> str | None:
    """A short ASCII-letter substring from the middle of ``text`` whose first occurrence is not at 0."""
    for length in (3, 2):
        starts = [i for i in range(1, len(text) - length + 1)
                  if text[i:i + length].isascii() and text[i:i + length].isalpha()
                  and text.find(text[i:i + length]) == i]
        if starts:
            i = starts[len(starts) // 2]
            return text[i:i + length]
    return None
