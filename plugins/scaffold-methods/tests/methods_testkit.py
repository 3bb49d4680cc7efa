"""Scripted engines and helpers for the scaffold-methods tests.

:class:`ScriptEngine` answers each sample of an episode with a fixed full
response (chosen by the sample index in the request id) and continues it
exactly when a request's prompt already holds part of it, so chunked
generation sees one response. Tokens are bytes (the core's ByteTokenizer).
The character ``~`` is a token the engine is unsure of; every other token is
sampled confidently:

* logprob: ``-3.0`` for ``~``, ``-0.05`` otherwise;
* top logprobs (``k`` entries, when asked): confident positions
  ``[-0.05, -6, -7, -8, ...]`` (top_k confidence ``(0.05 + 6 + 7 + 8 + 9) / 5 = 6.01``
  for k = 5), unsure positions ``[-3, -1, -1.5, -2, ...]`` (``(3 + 1 + 1.5 + 2 + 2.5) / 5 = 2.0``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from scaffold_testkit import ListTask, ScriptedEngine, make_contexts, run_episodes

from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.sampling import SamplingParams

UNSURE = "~"
CONFIDENT_LP, UNSURE_LP = -0.05, -3.0
ASSISTANT = "<|assistant|>\n"


def top_for(token: int, unsure: bool, k: int) -> dict[int, float]:
    """The top-``k`` logprobs of a position (the sampled token first)."""
    if unsure:
        others = [-1.0 - 0.5 * j for j in range(k - 1)]
        first = UNSURE_LP
    else:
        others = [-6.0 - j for j in range(k - 1)]
        first = CONFIDENT_LP
    return {token: first, **{1000 + j: v for j, v in enumerate(others)}}


def sample_of(request: GenerationRequest) -> int:
    """The sample index in a request id ``episode/attempt/sample/n``."""
    return int(request.request_id.split("/")[2])


class ScriptEngine(ScriptedEngine):
    """Sample ``i`` of an episode answers ``script(question, i)`` in full, continuing partial prompts.

    ``probe(prompt_text, request)`` answers prompts that end with something
    other than a partial response (a Dynasor probe, a judge's prompt);
    ``top``: whether top logprobs are given when asked.
    """

    def __init__(self, script: Callable[[str, int], str], *,
                 probe: Callable[[str, GenerationRequest], str] | None = None, markers: Sequence[str] = (),
                 top: bool = True, **options: Any):
        super().__init__(self._respond, **options)
        self.script = script
        self.probe = probe
        self.markers = tuple(markers)  # prompt texts that route a request to ``probe``
        self.top = top

    def _respond(self, prompt: str, request: GenerationRequest) -> str:
        if self.probe is not None and any(m in prompt for m in self.markers):
            return self.probe(prompt, request)
        head, _, partial = prompt.rpartition(ASSISTANT)
        question = head.rsplit("<|user|>\n", 1)[-1].split("<|end|>")[0]
        full = self.script(question, sample_of(request))
        if not full.startswith(partial):
            raise AssertionError(f"prompt continues {partial!r}, not a prefix of {full!r}")
        return full[len(partial):]

    def result_for(self, text: str, request: GenerationRequest) -> GenerationResult:
        result = super().result_for(text, request)
        unsure = self.tokenizer.encode(UNSURE)[0]
        result.logprobs = [UNSURE_LP if t == unsure else CONFIDENT_LP for t in result.output_ids]
        k = request.sampling.top_logprobs
        if k and self.top:
            result.top_logprobs = [top_for(t, t == unsure, k) for t in result.output_ids]
        return result


def run(controller: Any, engine: Any, rows: list[dict[str, Any]], sampling: SamplingParams, verifier: Any = None,
        **options: Any) -> list[Any]:
    """Run ``rows`` (``question``/``answer``) through the runtime; results in row order."""
    from scaffold_core.builtins.trajectories import SingleTurnTrajectoryMaker
    from scaffold_methods.arithmetic import ArithmeticVerifier

    contexts = make_contexts(ListTask(rows), engine.tokenizer, sampling)
    return run_episodes(contexts, engine=engine, controller=controller, verifier=verifier or ArithmeticVerifier(),
                        trajectory_maker=SingleTurnTrajectoryMaker(), **{"timeout": 60.0, **options})


def confidence_sampled(text: str) -> list[float]:
    """The ``sampled`` token confidences of a response text (each byte a token, EOS included)."""
    return [math.exp(UNSURE_LP if ch == UNSURE else CONFIDENT_LP) for ch in text.encode()] + [math.exp(CONFIDENT_LP)]
