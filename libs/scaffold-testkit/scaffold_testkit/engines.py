"""A deterministic engine for tests: responses are a function of the prompt."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from typing import Any

from scaffold_core.engine import Engine
from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.tokenizers import ByteTokenizer


class ScriptedEngine(Engine):
    """Answers with ``respond(prompt_text, request)``; honours max_tokens, stop strings and stop ids.

    ``delay`` (seconds, or a (low, high) range drawn per request from a
    seeded RNG) simulates latency; ``fail`` is a predicate on the prompt text
    that makes the request raise; ``hang`` one that makes it never return.
    Logprobs are a deterministic function of the token id. A request with
    ``on_token`` gets its ids handed over one by one (a loop turn apart), as an
    engine that decodes incrementally does.

    A request with a ``sampling.constraint`` is decoded under it (xgrammar, as in
    the embedded engine): each scripted token is taken when the grammar allows it,
    else the end token when allowed, else the lowest allowed token; so a script
    that follows the grammar comes out unchanged, and one that does not comes out
    forced into it.
    """

    def __init__(self, respond: Callable[..., str] | str = "#### 42", *, delay: Any = 0.0,
                 fail: Callable[[str], bool] | None = None, hang: Callable[[str], bool] | None = None,
                 seed: int = 0):
        self.tokenizer = ByteTokenizer()
        self.respond = respond
        self.delay = delay
        self.fail = fail
        self.hang = hang
        self.rng = random.Random(seed)
        self.context_length = 1 << 16
        self.requests: list[GenerationRequest] = []
        self.started = False
        self.closed = False
        self._grammars: Any = None

    @property
    def constraints(self) -> frozenset[str]:  # type: ignore[override]
        from scaffold_transformers.grammar import available_kinds

        return available_kinds()

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        prompt = self.tokenizer.decode(request.prompt_ids)
        if self.fail is not None and self.fail(prompt):
            raise EngineError("injected engine failure")
        if self.hang is not None and self.hang(prompt):
            await asyncio.Event().wait()
        delay = self.delay
        if isinstance(delay, (tuple, list)):
            delay = self.rng.uniform(*delay)
        if delay:
            await asyncio.sleep(delay)
        text = self.respond(prompt, request) if callable(self.respond) else self.respond
        result = self.result_for(text, request)
        if request.on_token is not None:  # decoded "incrementally": each id handed over, one loop turn apart
            for token in result.output_ids:
                request.on_token(token)
                await asyncio.sleep(0)
        return result

    def result_for(self, text: str, request: GenerationRequest) -> GenerationResult:
        tok = self.tokenizer
        sp = request.sampling
        ids = tok.encode(text) + [tok.eos_token_id]
        if sp.constraint is not None:
            ids = self._constrained(ids, request)
        finish = "stop"
        out: list[int] = []
        for tid in ids:
            out.append(tid)
            if tid == tok.eos_token_id or tid in sp.stop_token_ids:
                break
            if sp.stop and any(s in tok.decode(out) for s in sp.stop):
                break
            if len(out) >= sp.max_tokens:
                finish = "length"
                break
        decoded = tok.decode(out, skip_special_tokens=True)
        for s in sp.stop:
            at = decoded.find(s)
            if at >= 0:
                decoded = decoded[:at]
        logprobs = [-(1.0 + math.sin(t)) / 2.0 - 0.01 for t in out]
        return GenerationResult(out, logprobs, finish, decoded, 0)

    def _constrained(self, ids: list[int], request: GenerationRequest) -> list[int]:
        """``ids`` forced into the request's grammar (see the class docstring)."""
        from scaffold_transformers.grammar import Grammars

        tok = self.tokenizer
        if self._grammars is None:
            self._grammars = Grammars(tok, tok.vocab_size, {tok.eos_token_id})
        assert request.sampling.constraint is not None
        grammar = self._grammars.row(request.sampling.constraint)
        out: list[int] = []
        script = iter(ids)
        while len(out) < request.sampling.max_tokens and not grammar.done:
            allowed = grammar.allowed()
            want = next(script, tok.eos_token_id)
            token = want if want in allowed else tok.eos_token_id if tok.eos_token_id in allowed else min(allowed)
            grammar.accept(token)
            out.append(token)
            if token == tok.eos_token_id:
                break
        return out
