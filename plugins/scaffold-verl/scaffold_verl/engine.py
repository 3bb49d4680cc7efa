"""scaffold's engine contract over verl's ``server_manager.generate(request_id, prompt_ids=, sampling_params=)``.

* Sampling: each call sends a fresh dict: verl's per-batch
  ``sampling_params`` (``repetition_penalty``, ``logprobs``, ...) with the
  request's ``temperature``, ``top_p``, ``top_k``, ``stop`` and
  ``stop_token_ids`` and an explicit ``max_tokens``: the request's, capped
  like verl's servers cap it (``prompt_length + response_length - len(prompt_ids)``).
* ``request_id``: one per sample of an episode (all its turns), so verl's
  sticky routing keeps a conversation on one server.
* Stop reasons are not the same across verl's backends (vLLM says
  ``completed`` for both EOS and the token limit; SGLang says ``stop`` or
  ``length``), so they are normalised: ``stop`` and ``length`` as given;
  ``completed`` or anything else is ``stop`` when the last token is EOS or a
  stop id, ``length`` when the budget was used up, else ``stop``.
* Aborts (``aborted``/``abort``, e.g. a weight sync in fully-async training):
  the partial output is kept and the rest is requested with prompt +
  partial output and the remaining budget (up to ``max_resumes`` times,
  waiting ``resume_wait_s`` before each); out of budget it is ``length``.
* Logprobs come back only when verl's ``sampling_params["logprobs"]`` is
  true; otherwise results carry 0.0 and the episode reports none.
* Versions: each segment's tokens carry its ``extra_fields["global_steps"]``
  (the result's per-token ``versions``; a segment the server itself resumed
  across a weight sync, ``min_global_steps < max_global_steps``, gives its
  tokens the oldest). The last segment's ``extra_fields`` are kept in
  :class:`EpisodeLog`.
* Per episode: a ``run`` wraps its episode in :meth:`VerlEngine.episode`
  (verl's ``sampling_params`` in, the :class:`EpisodeLog` out); every
  request made inside that block, in whatever task the runtime runs it,
  sends those parameters and reports into that log (a context variable
  carries it, so concurrent episodes never mix).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from scaffold_core.engine import Engine
from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import eos_token_ids, response_text

ABORTED = ("aborted", "abort")


@dataclass
class EpisodeLog:
    """What one episode's generation calls reported, for its ``AgentLoopOutput``."""

    sampling_params: dict[str, Any] = field(default_factory=dict)
    calls: int = 0
    resumes: int = 0
    generate_s: float = 0.0
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)
    logprobs: bool = True

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.sampling_params.get("logprobs"))


#: The log of the episode whose requests are being made (set by :meth:`VerlEngine.episode`).
_EPISODE: ContextVar[EpisodeLog | None] = ContextVar("scaffold_verl_episode", default=None)


def sampling_from_verl(params: dict[str, Any], max_tokens: int) -> SamplingParams:
    """The episode's sampling parameters from verl's per-batch ``sampling_params``."""
    top_k = int(params.get("top_k", -1) or -1)
    return SamplingParams(max_tokens=max_tokens, temperature=float(params.get("temperature", 1.0)),
                          top_p=float(params.get("top_p", 1.0)), top_k=-1 if top_k <= 0 else top_k)


def sample_key(request: GenerationRequest) -> str:
    """One id per sample of an episode: the request id without its per-call counter."""
    rid = request.request_id
    if request.episode_id and rid.startswith(request.episode_id + "/"):
        return rid.rsplit("/", 1)[0]
    return rid


class VerlEngine(Engine):
    """Generates through verl's server manager (``LLMServerClient`` or ``FullyAsyncLLMServerClient``).

    ``prompt_length``/``response_length``: verl's rollout lengths.
    Each episode runs inside :meth:`episode`, which gives its requests verl's
    ``sampling_params`` and collects their :class:`EpisodeLog`.
    """

    def __init__(self, server_manager: Any, *, tokenizer: Any, prompt_length: int, response_length: int,
                 max_resumes: int = 16, resume_wait_s: float = 1.0):
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.max_resumes = max_resumes
        self.resume_wait_s = resume_wait_s
        self._eos = eos_token_ids(tokenizer)

    @contextmanager
    def episode(self, sampling_params: dict[str, Any]) -> Iterator[EpisodeLog]:
        """Requests made inside this block send verl's ``sampling_params`` and report into the log it yields."""
        log = EpisodeLog(sampling_params=dict(sampling_params))
        token = _EPISODE.set(log)
        try:
            yield log
        finally:
            _EPISODE.reset(token)

    @staticmethod
    def _log() -> EpisodeLog:
        log = _EPISODE.get()
        return log if log is not None else EpisodeLog()

    def _params(self, log: EpisodeLog, sampling: SamplingParams, max_tokens: int) -> dict[str, Any]:
        params = dict(log.sampling_params)
        params.pop("max_new_tokens", None)
        params.update(temperature=float(sampling.temperature), top_p=float(sampling.top_p), top_k=sampling.top_k,
                      max_tokens=max_tokens)
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            params["stop_token_ids"] = [int(t) for t in sampling.stop_token_ids]
        return params

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        log = self._log()
        prompt = list(request.prompt_ids)
        budget = min(request.sampling.max_tokens, self.prompt_length + self.response_length - len(prompt))
        if budget <= 0:
            raise EngineError(f"the prompt has {len(prompt)} tokens, leaving no room in verl's rollout.prompt_length + "
                              f"response_length ({self.prompt_length} + {self.response_length}); cap the conversation "
                              "(e.g. the multiturn_chat controller's max_total_tokens) or raise response_length",
                              retryable=False)
        tokens: list[int] = []
        logprobs: list[float] = []
        has_logprobs = log.wants_logprobs
        finish = ""
        resumes = 0
        versions: list[int] | None = []  # None once a segment with tokens reports no version
        known: list[int] = []
        while True:
            params = self._params(log, request.sampling, budget - len(tokens))
            started = time.perf_counter()
            out = await self.server_manager.generate(sample_key(request), prompt_ids=prompt + tokens,
                                                     sampling_params=params)
            log.generate_s += time.perf_counter() - started
            log.calls += 1
            seg = [int(t) for t in out.token_ids]
            seg_logprobs = self._segment_logprobs(out, seg, log)
            has_logprobs = has_logprobs and seg_logprobs is not None
            tokens += seg
            logprobs += seg_logprobs if seg_logprobs is not None else [0.0] * len(seg)
            version = self._note(log, out)
            if version is not None:
                known.append(version)
            if versions is not None and seg:
                versions = None if version is None else versions + [version] * len(seg)
            raw = out.stop_reason
            if raw in ABORTED and len(tokens) < budget:
                if resumes >= self.max_resumes:
                    finish = "abort"
                    break
                resumes += 1
                log.resumes += 1
                await asyncio.sleep(self.resume_wait_s)
                continue
            finish = self._finish(raw, seg, budget - len(tokens) + len(seg), request.sampling)
            break
        if not has_logprobs:
            log.logprobs = False
        return GenerationResult(
            output_ids=tokens, logprobs=logprobs, finish_reason=finish,
            text=response_text(self.tokenizer, tokens, request.sampling.stop),
            weight_version=min(known) if known else None, versions=versions if known else None,
            meta={"stop_reason": raw, "resumes": resumes, **({"message": "aborted too often"} if finish == "abort"
                                                                else {})},
        )

    def _segment_logprobs(self, out: Any, seg: list[int], log: EpisodeLog) -> list[float] | None:
        if not log.wants_logprobs or out.log_probs is None:
            return None if seg else []
        values = [float(x) for x in out.log_probs]
        if len(values) != len(seg):
            raise EngineError(f"server_manager.generate returned {len(seg)} token ids but {len(values)} log_probs",
                              retryable=True)
        if not all(math.isfinite(x) for x in values):
            raise EngineError("server_manager.generate returned a log_prob that is not finite", retryable=False)
        return values

    def _note(self, log: EpisodeLog, out: Any) -> int | None:
        """Record a segment's extra fields and preemptions in ``log``; return its tokens' weight version (the
        oldest, ``min_global_steps``, when the server resumed it across a weight sync; None when it reports none)."""
        extra = dict(getattr(out, "extra_fields", None) or {})
        log.extra_fields = extra
        preempted = getattr(out, "num_preempted", None)
        if preempted is not None:
            log.num_preempted = (log.num_preempted or 0) + int(preempted)
        for key in ("min_global_steps", "global_steps"):
            value = extra.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    def _finish(self, raw: str | None, seg: list[int], asked: int, sampling: SamplingParams) -> str:
        if raw in ("stop", "length"):
            return raw
        if seg and (seg[-1] in self._eos or seg[-1] in sampling.stop_token_ids):
            return "stop"
        return "length" if raw in ABORTED or len(seg) >= asked else "stop"
