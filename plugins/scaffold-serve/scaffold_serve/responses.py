"""Response bodies in OpenAI's shapes: a chat completion, its stream chunks (server-sent events), usage, logprobs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from .session import Choice
from .token_bytes import token_bytes, token_text


def usage(prompt_tokens: int, choices: Sequence[Choice]) -> dict[str, int]:
    completion = sum(len(c.result.output_ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _token(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    raw = token_bytes(tokenizer, token_id)
    return {"token": token_text(raw), "logprob": logprob, "bytes": list(raw)}


def logprobs_of(tokenizer: Any, choice: Choice, top: int = 0) -> dict[str, Any]:
    """Each sampled token (the end-of-turn token included) with the logprob the engine sampled it at, and, when
    ``top`` > 0, the ``top`` most likely tokens at its position as the engine gave them (none when it gave none)."""
    result = choice.result
    tops = result.top_logprobs if top and result.top_logprobs is not None else [None] * len(result.output_ids)
    content = []
    for token_id, logprob, alternatives in zip(result.output_ids, result.logprobs, tops):
        likely = sorted((alternatives or {}).items(), key=lambda kv: -kv[1])[:top]
        content.append({**_token(tokenizer, token_id, logprob),
                        "top_logprobs": [_token(tokenizer, t, lp) for t, lp in likely]})
    return {"content": content, "refusal": None}


def completion(cid: str, created: int, model: str, choices: Sequence[Choice], prompt_tokens: int, *,
               logprobs: bool, tokenizer: Any, top_logprobs: int = 0) -> dict[str, Any]:
    return {
        "id": cid, "object": "chat.completion", "created": created, "model": model, "system_fingerprint": None,
        "choices": [{"index": c.index, "message": c.message(), "finish_reason": c.finish_reason,
                     "logprobs": logprobs_of(tokenizer, c, top_logprobs) if logprobs else None} for c in choices],
        "usage": usage(prompt_tokens, choices),
    }


def dumps(data: Any) -> bytes:
    """Compact JSON (a NaN or infinity, which JSON cannot hold, is written as null)."""
    return orjson.dumps(data)


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def _chunk(cid: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any) -> bytes:
    return sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": None, "choices": choices, **extra})


def first_chunks(cid: str, created: int, model: str, n: int) -> bytes:
    """The chunk every choice starts with (the role), sent before anything is generated."""
    return b"".join(_chunk(cid, created, model, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None}]) for i in range(n))


def content_chunk(cid: str, created: int, model: str, index: int, text: str) -> bytes:
    """A piece of a choice's content, streamed as the engine samples it."""
    return _chunk(cid, created, model, [{"index": index, "delta": {"content": text}, "logprobs": None,
                                         "finish_reason": None}])


def choice_chunks(cid: str, created: int, model: str, choice: Choice, *, logprobs: bool,
                  tokenizer: Any, top_logprobs: int = 0, rest: str | None = None) -> Iterator[bytes]:
    """A generated choice as chunks: its content (``rest``: what is left of it after the pieces already streamed;
    with every token's logprobs), its tool calls, then its finish reason."""
    i = choice.index
    lp = logprobs_of(tokenizer, choice, top_logprobs) if logprobs else None
    content = (choice.content or "") if rest is None else rest
    if content or lp is not None:
        yield _chunk(cid, created, model, [{"index": i, "delta": {"content": content}, "logprobs": lp,
                                             "finish_reason": None}])
    for k, wire in enumerate(choice.message().get("tool_calls", [])):
        delta = {"tool_calls": [{"index": k, **wire}]}
        yield _chunk(cid, created, model, [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
    yield _chunk(cid, created, model, [{"index": i, "delta": {}, "logprobs": None,
                                         "finish_reason": choice.finish_reason}])


def usage_chunk(cid: str, created: int, model: str, prompt_tokens: int, choices: Sequence[Choice]) -> bytes:
    return _chunk(cid, created, model, [], usage=usage(prompt_tokens, choices))


def error_event(body: dict[str, Any]) -> bytes:
    return sse(body)
