"""``benchmark_canned``: a BENCHMARK-ONLY engine that returns the same canned tokens instantly.

It measures the runtime's own overhead (scheduling, controllers,
verification, trajectories) with the model taken out. It produces no real
text: never use it for data. Its tokenizer is the dependency-free
:class:`~scaffold_core.tokenizers.ByteTokenizer`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from annotated_types import Ge

from ..engine import Engine
from ..generation import GenerationRequest, GenerationResult
from ..tokenizers import ByteTokenizer


class CannedBenchmarkEngine(Engine):
    """BENCHMARK ONLY: answers every request instantly with ``response`` (no model)."""

    def __init__(self, response: str = "Adding them gives 42.\n#### 42", logprob: float = -0.25,
                 delay_s: Annotated[float, Ge(0)] = 0.0):
        self.tokenizer = ByteTokenizer()
        self.response = response
        self.delay_s = delay_s
        self._ids = self.tokenizer.encode(response) + [self.tokenizer.eos_token_id]
        self._logprobs = [float(logprob)] * len(self._ids)
        self.context_length = 1 << 20
        self.requests = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        n = request.sampling.max_tokens
        stops = [self.response.find(stop) + len(stop) for stop in request.sampling.stop if stop in self.response]
        if stops:  # ends on a stop string, which it keeps (as engines do); a server cuts it from the content
            whole = self.tokenizer.encode(self.response[:min(stops)])
            ids = whole[:n]
            return GenerationResult(ids, self._logprobs[:len(ids)], "stop" if len(ids) == len(whole) else "length",
                                    self.tokenizer.decode(ids), 0)
        if n >= len(self._ids):
            return GenerationResult(self._ids[:], self._logprobs[:], "stop", self.response, 0)
        ids = self._ids[:n]
        return GenerationResult(ids, self._logprobs[:n], "length", self.tokenizer.decode(ids), 0)
