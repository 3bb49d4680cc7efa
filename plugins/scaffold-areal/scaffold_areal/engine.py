"""scaffold's engine contract over AReaL's ``InferenceEngine.agenerate``.

One scaffold :class:`~scaffold_core.generation.GenerationRequest` becomes one
``ModelRequest(rid, input_ids, gconfig, tokenizer)``; the ``ModelResponse``
comes back as a :class:`~scaffold_core.generation.GenerationResult` with the
sampled ids and behaviour logprobs exactly as AReaL returned them.

* Sampling: each request's ``gconfig`` is the workflow's with the request's
  sampling applied (``max_new_tokens``, ``temperature``/``greedy``,
  ``top_p``, ``top_k``, ``stop``, ``stop_token_ids``; ``seed`` only when the
  workflow's gconfig sets one) and ``n_samples=1``: grouping is AReaL's job.
  Every other field (``max_tokens``, ``min_new_tokens``, penalties,
  ``lora_name``...) is the workflow's.
* ``rid`` is the episode id, so every turn of an episode goes to the same
  server (AReaL routes by rid; shared prefixes stay cached).
* Versions: AReaL pauses, aborts and resumes requests around weight updates
  itself and reports a version per token (``output_versions``): they are
  the result's ``versions`` (so a response a weight update interrupted reads
  ``[5, 5, 6, 6]``), and ``weight_version`` is the first (oldest) token's.
  They travel with the tokens into the sample and its training sequence,
  whatever the controller does with them.
* Stop reasons: ``stop`` and ``tool_calls`` are ``stop``; ``length`` is
  ``length``; ``abort`` (AReaL reports none: it resubmits) is ``abort``,
  which the runtime retries.
"""

from __future__ import annotations

import math
from typing import Any

from scaffold_core.engine import Engine
from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import response_text

#: AReaL's ``top_k`` default: the whole vocabulary (scaffold says -1).
ALL_TOKENS = int(1e8)

STOP_REASONS = {"stop": "stop", "tool_calls": "stop", "length": "length", "abort": "abort"}


def sampling_from_gconfig(gconfig: Any) -> SamplingParams:
    """The episode's sampling parameters from AReaL's ``GenerationHyperparameters``."""
    top_k = int(gconfig.top_k)
    return SamplingParams(
        max_tokens=int(gconfig.max_new_tokens),
        temperature=0.0 if gconfig.greedy else float(gconfig.temperature),
        top_p=float(gconfig.top_p),
        top_k=-1 if top_k >= ALL_TOKENS or top_k <= 0 else top_k,
        stop=tuple(gconfig.stop or ()),
        stop_token_ids=tuple(int(t) for t in gconfig.stop_token_ids or ()),
        seed=getattr(gconfig, "seed", None),
    )


def gconfig_for(base: Any, sampling: SamplingParams, seed: int | None) -> Any:
    """``base`` with one request's sampling applied (a new object; ``base`` is never changed)."""
    changes: dict[str, Any] = dict(
        n_samples=1, max_new_tokens=sampling.max_tokens, greedy=sampling.temperature == 0,
        temperature=float(sampling.temperature), top_p=float(sampling.top_p),
        top_k=ALL_TOKENS if sampling.top_k == -1 else sampling.top_k,
        stop=list(sampling.stop) or None, stop_token_ids=[int(t) for t in sampling.stop_token_ids],
    )
    if getattr(base, "seed", None) is not None and seed is not None:
        changes["seed"] = int(seed)
    return base.new(**changes)


class ArealEngine(Engine):
    """Generates through an AReaL inference engine (``RemoteSGLangEngine``, ``RemotevLLMEngine``, ...).

    ``engine``: AReaL's engine (the one ``arun_episode`` receives).
    ``request_cls``: AReaL's ``ModelRequest``. ``gconfig``: the workflow's
    ``GenerationHyperparameters``. ``tokenizer``: the Hugging Face tokenizer
    prompts are rendered with (also handed to AReaL in each request).
    The AReaL engine's lifecycle is AReaL's: ``start``/``close`` do nothing.
    """

    def __init__(self, engine: Any, *, request_cls: type, gconfig: Any, tokenizer: Any):
        self.areal_engine = engine
        self.request_cls = request_cls
        self.gconfig = gconfig
        self.tokenizer = tokenizer
        self.context_length = int(gconfig.max_tokens)
        self.requests = 0
        self.resumed_responses = 0

    @property
    def weight_version(self) -> int:  # type: ignore[override, unused-ignore]
        """AReaL's current weight version (``engine.get_version()``)."""
        return int(self.areal_engine.get_version())

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt = list(request.prompt_ids)
        room = min(int(self.gconfig.max_tokens) - len(prompt), request.sampling.max_tokens)
        if room <= 0:
            raise EngineError(f"the prompt has {len(prompt)} tokens, which leaves no room under gconfig.max_tokens "
                              f"({self.gconfig.max_tokens}): raise gconfig.max_tokens or shorten the conversation",
                              retryable=False)
        req = self.request_cls(rid=request.episode_id or request.request_id, input_ids=prompt,
                               gconfig=gconfig_for(self.gconfig, request.sampling, request.seed),
                               tokenizer=self.tokenizer)
        self.requests += 1
        response = await self.areal_engine.agenerate(req)
        tokens = [int(t) for t in response.output_tokens]
        logprobs = [float(x) for x in response.output_logprobs]
        versions = [int(v) for v in response.output_versions]
        if not len(tokens) == len(logprobs) == len(versions):
            raise EngineError(f"agenerate returned {len(tokens)} tokens, {len(logprobs)} logprobs and "
                              f"{len(versions)} versions; they must be equal", retryable=False)
        if not all(math.isfinite(x) for x in logprobs):
            raise EngineError("agenerate returned a logprob that is not finite", retryable=False)
        finish = STOP_REASONS.get(response.stop_reason)
        if finish is None:
            raise EngineError(f"agenerate returned stop_reason {response.stop_reason!r}; expected one of "
                              f"{sorted(STOP_REASONS)}", retryable=False)
        if len(set(versions)) > 1:
            self.resumed_responses += 1
        return GenerationResult(
            output_ids=tokens, logprobs=logprobs, finish_reason=finish,
            text=response_text(self.tokenizer, tokens, request.sampling.stop),
            weight_version=versions[0] if versions else self.weight_version, versions=versions,
            meta={"stop_reason": response.stop_reason},
        )

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests, "resumed_responses": self.resumed_responses}
