"""Where a model judge runs when it is not the run's own engine: an OpenAI-compatible URL or another engine.

Both give a :class:`Judged` reply for chat messages, awaited on the run's
event loop (``complete``) or from a verifier's worker thread
(``complete_sync``).

* :class:`UrlBackend`: ``POST <url>/chat/completions`` (any OpenAI-compatible
  server: SGLang, vLLM, a hosted API). A reply is read up to 4 MiB; a
  transport failure or a reply that is not a chat completion raises (the
  episode fails, retryable), while a well-formed reply whose judgement does
  not parse leaves the response unscored.
* :class:`EngineBackend`: an engine plugin built from an engine section
  (``{name: transformers, model: ...}``), started once on the loop of its
  first use (the run's loop, or a private loop thread when only a verifier
  thread uses it) and closed with :meth:`EngineBackend.close`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scaffold_core.errors import EngineError, VerifierError
from scaffold_core.generation import GenerationRequest
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import render_chat

MAX_REPLY_BYTES = 4 << 20


class JudgeError(VerifierError):
    """A judge could not be asked (transport, HTTP status, a reply that is not a chat completion).

    ``retryable`` says whether running the episode again may succeed.
    """

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


@dataclass
class Judged:
    """A judge's reply: its text, how many tokens it generated, and its first token's alternatives."""

    text: str
    tokens: int
    top: dict[str, float] | None = None  # first position: token text -> logprob
    sampled: tuple[str, float] | None = None  # first token's text and logprob


@dataclass(frozen=True)
class Ask:
    """How to sample a judgement."""

    max_tokens: int
    temperature: float
    top_logprobs: int = 0


class UrlBackend:
    """An OpenAI-compatible chat-completions endpoint."""

    def __init__(self, url: str, model: str, *, api_key_env: str | None = None, timeout: float = 120.0,
                 transport: Any = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if not model:
            raise ValueError("a judge at a url needs model: the model name the server serves")
        if api_key_env is not None and not api_key_env.replace("_", "").isalnum():
            raise ValueError(f"api_key_env must name an environment variable, got {api_key_env!r}")
        base = url.rstrip("/")
        self.endpoint = base if base.endswith("/chat/completions") else base + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.transport = transport  # tests: an httpx transport (MockTransport)

    def label(self) -> str:
        return self.endpoint

    def _request(self, messages: Sequence[dict[str, Any]], ask: Ask) -> tuple[dict[str, str], dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise JudgeError(f"the judge's api_key_env {self.api_key_env} is not set in the environment",
                                    retryable=False)
            headers["Authorization"] = f"Bearer {key}"
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "max_tokens": ask.max_tokens,
                                "temperature": ask.temperature}
        if ask.top_logprobs:
            body.update(logprobs=True, top_logprobs=min(ask.top_logprobs, 20))
        return headers, body

    async def complete(self, messages: Sequence[dict[str, Any]], ask: Ask) -> Judged:
        import httpx

        headers, body = self._request(messages, ask)
        try:
            async with httpx.AsyncClient(timeout=self.timeout, transport=self.transport) as client:
                async with client.stream("POST", self.endpoint, json=body, headers=headers) as response:
                    payload = bytearray()
                    async for part in response.aiter_bytes():
                        self._grow(payload, part)
                    status = response.status_code
        except httpx.HTTPError as exc:
            raise JudgeError(f"the judge at {self.endpoint} failed: {type(exc).__name__}: {exc}") from exc
        return read_completion(status, bytes(payload), self.endpoint)

    def _grow(self, payload: bytearray, part: bytes) -> None:
        """Append a part of the reply; a reply over MAX_REPLY_BYTES is refused before it is all read."""
        payload += part
        if len(payload) > MAX_REPLY_BYTES:
            raise JudgeError(f"the judge at {self.endpoint} sent a reply over {MAX_REPLY_BYTES >> 20} MiB")

    def complete_sync(self, messages: Sequence[dict[str, Any]], ask: Ask) -> Judged:
        import httpx

        headers, body = self._request(messages, ask)
        try:
            with httpx.Client(timeout=self.timeout, transport=self.transport) as client:
                with client.stream("POST", self.endpoint, json=body, headers=headers) as response:
                    payload = bytearray()
                    for part in response.iter_bytes():
                        self._grow(payload, part)
                    status = response.status_code
        except httpx.HTTPError as exc:
            raise JudgeError(f"the judge at {self.endpoint} failed: {type(exc).__name__}: {exc}") from exc
        return read_completion(status, bytes(payload), self.endpoint)

    async def start(self) -> None:
        """Nothing to start (a client is made per call, on the loop that awaits it)."""

    async def close(self) -> None:
        """Nothing to close."""


def read_completion(status: int, payload: bytes, endpoint: str) -> Judged:
    """A chat-completions reply as a :class:`Judged`; raises VerifierError when it is not one."""
    shown = payload[:300].decode("utf-8", errors="replace")
    if status != 200:
        raise JudgeError(f"the judge at {endpoint} answered HTTP {status}: {shown}",
                            retryable=status >= 500 or status == 429)
    try:
        data = json.loads(payload)
        choice = data["choices"][0]
        content = choice["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
        raise JudgeError(f"the judge at {endpoint} sent no chat completion ({type(exc).__name__}): {shown}",
                            retryable=False) from None
    usage = data.get("usage") if isinstance(data, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    judged = Judged(text=content if isinstance(content, str) else "",
                    tokens=tokens if isinstance(tokens, int) and tokens >= 0 else 0)
    first = _first_logprobs(choice)
    if first is not None:
        judged.sampled, judged.top = first
    return judged


def _first_logprobs(choice: Any) -> tuple[tuple[str, float], dict[str, float]] | None:
    try:
        entry = choice["logprobs"]["content"][0]
        sampled = (str(entry["token"]), float(entry["logprob"]))
        top = {str(t["token"]): float(t["logprob"]) for t in entry.get("top_logprobs") or []}
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return sampled, top


class EngineBackend:
    """Another engine (any engine plugin), built from its config section, judging chat messages."""

    def __init__(self, spec: dict[str, Any], *, start_timeout: float = 900.0, timeout: float = 300.0):
        from scaffold_core.plugins import current_registry

        spec = dict(spec)
        name = spec.pop("name", None)
        if not isinstance(name, str):
            raise ValueError(f"engine must be 'policy' or an engine section with a name, e.g. "
                             f"{{name: transformers}}; got {spec!r}")
        self.name = name
        self.engine = current_registry().create("engine", name, spec, path="verifier.engine")
        self.start_timeout = start_timeout
        self.timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock = threading.Lock()
        self._private: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
        self._calls = 0

    def label(self) -> str:
        return f"engine {self.name!r}"

    async def start(self) -> None:
        """Start the engine on the running loop (once; later calls on that loop return at once)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise RuntimeError(f"the judge's engine {self.name!r} runs on another event loop; close() it first")
        try:
            await asyncio.wait_for(self.engine.start(), self.start_timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise EngineError(f"the judge's engine {self.name!r} did not start within {self.start_timeout:g} s",
                              retryable=False) from None
        self._loop = loop

    async def complete(self, messages: Sequence[dict[str, Any]], ask: Ask) -> Judged:
        await self.start()
        tokenizer = self.engine.tokenizer
        _, ids = render_chat(tokenizer, messages)
        self._calls += 1
        sampling = SamplingParams(max_tokens=ask.max_tokens, temperature=ask.temperature,
                                  top_logprobs=ask.top_logprobs)
        request = GenerationRequest(f"judge/{self._calls}", ids, sampling, seed=self._calls)
        try:
            result = (await self.engine.generate(request)).check()
        except Exception as exc:
            raise JudgeError(f"the judge's engine {self.name!r} raised {type(exc).__name__}: {exc}") from exc
        return judged_from_result(result, tokenizer)

    def complete_sync(self, messages: Sequence[dict[str, Any]], ask: Ask) -> Judged:
        """From a worker thread: run :meth:`complete` on the engine's loop (a private one if it has none)."""
        loop = self._loop or self._private_loop()
        future = asyncio.run_coroutine_threadsafe(self.complete(messages, ask), loop)
        try:
            return future.result(self.timeout + (0 if self._loop else self.start_timeout))
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise JudgeError(f"the judge's engine {self.name!r} did not answer within {self.timeout:g} s") \
                from None

    def _private_loop(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._private is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=f"scaffold-judge-{self.name}", daemon=True)
                thread.start()
                self._private = (loop, thread)
            return self._private[0]

    async def close(self) -> None:
        """Close the engine (on the loop it runs on) and stop a private loop. Safe twice."""
        loop, self._loop = self._loop, None
        if loop is not None:
            if loop is asyncio.get_running_loop():
                await self.engine.close()
            elif loop.is_running():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.engine.close(), loop))
        self.close_private()

    def close_private(self) -> None:
        private, self._private = self._private, None
        if private is None:
            return
        loop, thread = private
        if self._loop is loop:
            self._loop = None
            asyncio.run_coroutine_threadsafe(self.engine.close(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        if not thread.is_alive():
            loop.close()


def judged_from_result(result: Any, tokenizer: Any) -> Judged:
    """A :class:`Judged` from an engine's GenerationResult (first position's alternatives decoded)."""
    judged = Judged(text=result.text, tokens=len(result.output_ids))
    if result.output_ids:
        judged.sampled = (_piece(tokenizer, result.output_ids[0]), result.logprobs[0])
    if result.top_logprobs:
        first = result.top_logprobs[0]
        top: dict[str, float] = {}
        for token, lp in first.items():
            piece = _piece(tokenizer, token)
            top[piece] = lp if piece not in top else _logaddexp(top[piece], lp)  # pieces that read alike add up
        judged.top = top
    return judged


def _logaddexp(a: float, b: float) -> float:
    high = max(a, b)
    return high + math.log1p(math.exp(min(a, b) - high)) if high > -math.inf else high


def _piece(tokenizer: Any, token: int) -> str:
    try:
        return str(tokenizer.decode([token], skip_special_tokens=True))
    except Exception:
        return ""
