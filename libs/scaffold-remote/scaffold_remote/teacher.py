"""Teachers on inference servers: teacher-forced logprobs of the student's tokens over HTTP.

:class:`RemoteTeacher` sends each ``score_batch`` as requests of up to ``max_batch_size`` sequences (the
server batches the prompts of one request), ``max_concurrency`` of them in flight, on the lean
connection pool remote engines use (:mod:`scaffold_remote.http`). A subclass says what one request is
(:meth:`RemoteTeacher.body`) and how its answer reads (:meth:`RemoteTeacher.parse`):

* :class:`OpenAICompletionsTeacher` (``engine: openai``): any OpenAI-compatible ``POST /v1/completions``
  that echoes the prompt's logprobs: a token-id ``prompt`` (a list of them for a batch), ``echo: true``,
  ``logprobs: k``, ``max_tokens: 1``; ``choices[i].logprobs.token_logprobs`` starts with the prompt's
  tokens (the first without a logprob). The server must take token-id prompts (vLLM does); the top-k
  alternatives are kept only when the server names tokens by id (vLLM's
  ``return_tokens_as_token_ids``, asked for here), since decoded text does not name one token.
* ``scaffold_vllm.teacher.VLLMTeacher`` (``engine: vllm``): vLLM's ``prompt_logprobs``.
* ``scaffold_sglang.teacher.SGLangTeacher`` (``engine: sglang``): SGLang's ``input_token_logprobs``.

Every request scores ``prompt_ids + completion_ids`` exactly as the student saw and sampled them; the
answer's token ids, where it gives them, are checked against those sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson

from scaffold_core.teacher import Teacher, TeacherScores

from .client import ProtocolError, decode_json, error_message
from .http import ConnectionPool

Pair = tuple[Sequence[int], Sequence[int]]


class RemoteTeacher(Teacher):
    """A teacher served over HTTP at ``url`` (see the module docstring)."""

    path = "/v1/completions"

    def __init__(self, url: str, *, model: str | None = None, tokenizer: str | None = None,
                 api_key: str | None = None, max_batch_size: int = 16, max_concurrency: int = 4, top_k: int = 0,
                 timeout: float = 600.0, connect_timeout: float = 30.0, trust_remote_code: bool = False):
        super().__init__()
        if not url or not url.startswith(("http://", "https://")):
            raise ValueError(f"teacher url must be an http:// or https:// URL, got {url!r}")
        if max_batch_size < 1 or max_concurrency < 1:
            raise ValueError("teacher max_batch_size and max_concurrency must be >= 1")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no alternatives), got {top_k}")
        self.url = url.rstrip("/")
        self.model = model
        self.tokenizer_name = tokenizer or model
        self.api_key = api_key
        self.max_batch_size = max_batch_size
        self.max_concurrency = max_concurrency
        self.top_k = top_k
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.trust_remote_code = trust_remote_code
        self.requests = 0
        self._pool: ConnectionPool | None = None

    async def start(self) -> None:
        from .tokenizer import load_tokenizer

        if self.tokenizer is None:
            from scaffold_core.engines.model_loading import DEFAULT_HUB_MODEL

            self.tokenizer = await asyncio.to_thread(load_tokenizer, self.tokenizer_name or DEFAULT_HUB_MODEL,
                                                     trust_remote_code=self.trust_remote_code)
        if self._pool is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            self._pool = ConnectionPool(limit=self.max_concurrency, request_timeout=self.timeout,
                                        connect_timeout=self.connect_timeout, headers=headers)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _score(self, batch: Sequence[Pair]) -> list[TeacherScores]:
        if self._pool is None:
            raise RuntimeError(f"{type(self).__name__}: call start() before scoring")
        chunks = [list(batch[i:i + self.max_batch_size]) for i in range(0, len(batch), self.max_batch_size)]
        parts = await asyncio.gather(*(self._request(chunk) for chunk in chunks))
        return [score for part in parts for score in part]

    async def _request(self, chunk: list[Pair]) -> list[TeacherScores]:
        assert self._pool is not None
        endpoint = self._pool.endpoint(self.url, self.path)
        status, payload = await self._pool.request(endpoint, orjson.dumps(self.body(chunk)))
        self.requests += 1
        if status != 200:
            raise RuntimeError(f"teacher at {self.url}{self.path}: {error_message(status, payload)}")
        scores = self.parse(decode_json(payload), chunk)
        if len(scores) != len(chunk):
            raise ProtocolError(f"teacher at {self.url}: {len(scores)} answers for {len(chunk)} sequences")
        return scores

    def body(self, chunk: list[Pair]) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def completions_body(self, chunk: list[Pair], **fields: Any) -> dict[str, Any]:
        """A ``/v1/completions`` request scoring each whole sequence (prompt then completion, as token ids), one
        greedy token generated, the served ``model`` named when configured, and ``fields``."""
        body: dict[str, Any] = {"prompt": [list(p) + list(c) for p, c in chunk], "max_tokens": 1,
                                "temperature": 0.0, **fields}
        if self.model is not None:
            body["model"] = self.model
        return body

    def parse(self, data: Any, chunk: list[Pair]) -> list[TeacherScores]:  # pragma: no cover - abstract
        raise NotImplementedError


def number(value: Any, where: str) -> float:
    """A logprob from an answer (ProtocolError when it is missing or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"{where}: expected a logprob, got {value!r:.80}")
    return float(value)


def choices_in_order(data: Any, count: int) -> list[dict[str, Any]]:
    """An OpenAI-style answer's ``choices``, one per prompt, in the prompts' order (by their ``index``)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or len(choices) != count or not all(isinstance(c, dict) for c in choices):
        raise ProtocolError(f"expected {count} choices (one per prompt), got {str(choices)[:200]}")
    return sorted(choices, key=lambda c: c.get("index", 0))


def token_of(name: Any) -> int | None:
    """The id in a ``token_id:<id>`` token name (None for decoded text)."""
    if isinstance(name, str) and name.startswith("token_id:"):
        try:
            return int(name[len("token_id:"):])
        except ValueError:
            return None
    return None


class OpenAICompletionsTeacher(RemoteTeacher):
    """Any OpenAI-compatible ``/v1/completions`` that echoes prompt logprobs (``echo`` + ``logprobs``)."""

    def body(self, chunk: list[Pair]) -> dict[str, Any]:
        return self.completions_body(chunk, echo=True, logprobs=self.top_k, return_tokens_as_token_ids=True)

    def parse(self, data: Any, chunk: list[Pair]) -> list[TeacherScores]:
        out = []
        for (prompt, completion), choice in zip(chunk, choices_in_order(data, len(chunk))):
            lp = choice.get("logprobs")
            if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
                raise ProtocolError("the answer has no logprobs.token_logprobs: the server must support echo with "
                                    "logprobs on /v1/completions (vLLM does)")
            n, m = len(prompt), len(completion)
            values, names = lp["token_logprobs"], lp.get("tokens") or []
            if len(values) < n + m:
                raise ProtocolError(f"echo gave {len(values)} logprobs for a {n + m}-token sequence: the server "
                                    "does not echo the prompt's logprobs")
            ids = [token_of(t) for t in names[n:n + m]]
            if len(ids) == m and None not in ids and ids != list(completion):
                raise ProtocolError("the echoed tokens are not the completion's token ids")
            logprobs = [number(v, f"token_logprobs[{n + j}]") for j, v in enumerate(values[n:n + m])]
            tops = None
            if self.top_k and isinstance(lp.get("top_logprobs"), list):
                named = [{token_of(k): number(v, "top_logprobs") for k, v in (entry or {}).items()}
                         for entry in lp["top_logprobs"][n:n + m]]
                if all(None not in entry for entry in named):
                    tops = [{int(k): v for k, v in entry.items() if k is not None} for entry in named]
            out.append(TeacherScores(logprobs, tops))
        return out
