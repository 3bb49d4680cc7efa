"""vLLM's token-in/token-out wire formats: request bodies out, results in (pure functions, no I/O).

Two endpoints, written from vLLM's own request and response models:

* ``POST /inference/v1/generate`` (the default): ``{"request_id", "token_ids",
  "sampling_params"}``, where ``sampling_params`` is vLLM's
  ``SamplingParams`` (a msgspec struct: a key it does not know is dropped
  without a word, so only known names are ever sent). The answer's
  ``choices[0]`` holds ``token_ids``, ``finish_reason`` and
  ``logprobs.content``: one entry per token, ``{"token": "token_id:<id>",
  "logprob", "top_logprobs": [...]}`` (newer servers write ``"token_id":
  <id>`` instead; both are read). No text: the engine decodes the ids.
* ``POST /v1/completions`` with a token-id ``prompt`` (the fallback for
  servers without the generate endpoint): the request sets
  ``return_tokens_as_token_ids`` (and ``return_token_ids``), because the
  logprob ``tokens`` are otherwise decoded text, and two token ids with the
  same text (or bytes that are not text) cannot be told apart; a server
  started with ``--return-tokens-as-token-ids`` sends ``token_id:<id>``
  strings whatever the request says. Ids come from ``choices[0].token_ids``
  when the server sends them, else from those strings; text that is not an
  id is refused rather than re-tokenized.

Both always send ``max_tokens`` (vLLM's default is 16 tokens: the bug a
silent default once caused), ``temperature``, ``top_p``, ``top_k`` and the
request's ``seed`` (vLLM honours a per-request seed), and ask for logprobs
(``logprobs: 0`` is the sampled token's only; ``k`` adds the top ``k``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson
from scaffold_remote.client import ProtocolError, WireProtocol, decode_json, encode_ids

from scaffold_core.generation import GenerationRequest, GenerationResult

GENERATE_PATH = "/inference/v1/generate"
COMPLETIONS_PATH = "/v1/completions"
TOKEN_PREFIX = "token_id:"
_MAX_SEED = (1 << 63) - 1

#: Keys scaffold derives from the run's ``sampling:`` section; never taken from ``sampling_extra``.
MANAGED_KEYS: frozenset[str] = frozenset({
    "max_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "seed", "logprobs", "n",
})
#: ``SamplingParams`` fields ``sampling_extra`` may set on ``/inference/v1/generate`` (vLLM 0.10 to 2026).
GENERATE_EXTRA: frozenset[str] = frozenset({
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output", "truncate_prompt_tokens",
    "structured_outputs", "logit_bias", "allowed_token_ids", "bad_words", "extra_args", "thinking_token_budget",
})
#: ``CompletionRequest`` fields ``sampling_extra`` may set on ``/v1/completions``.
COMPLETIONS_EXTRA: frozenset[str] = frozenset({
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output", "truncate_prompt_tokens",
    "structured_outputs", "logit_bias", "allowed_token_ids", "priority", "cache_salt", "vllm_xargs",
})
#: A request's constraint as vLLM's ``structured_outputs`` (``StructuredOutputsParams``) field that takes it.
STRUCTURED_OUTPUT_FIELDS = {"json_schema": "json", "regex": "regex", "ebnf": "grammar",
                            "structural_tag": "structural_tag"}
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort", "error": "abort"}


def check_extra_sampling(extra: Mapping[str, Any] | None, allowed: frozenset[str] = GENERATE_EXTRA,
                         where: str = GENERATE_PATH) -> dict[str, Any]:
    """Validate ``engine.sampling_extra`` against what ``where`` accepts (vLLM drops unknown keys silently)."""
    out = dict(extra or {})
    managed = sorted(k for k in out if k in MANAGED_KEYS)
    if managed:
        raise ValueError(
            f"{', '.join(map(repr, managed))} come from the run's `sampling:` section (max_tokens, temperature, "
            "top_p, top_k, stop, stop_token_ids, seed; logprobs are always asked for); set them there, not in "
            "engine.sampling_extra")
    unknown = sorted(k for k in out if k not in allowed)
    if unknown:
        raise ValueError(
            f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not a sampling field of vLLM's "
            f"{where} (vLLM would drop it without a word); allowed: {', '.join(sorted(allowed))}")
    return out


def sampling_fields(request: GenerationRequest) -> dict[str, Any]:
    """The fields both endpoints share, mapped one to one from ``request.sampling`` and ``request.seed``."""
    sp = request.sampling
    fields: dict[str, Any] = {
        "max_tokens": int(sp.max_tokens),
        "temperature": float(sp.temperature),
        "top_p": float(sp.top_p),
        "top_k": int(sp.top_k),
        "logprobs": int(sp.top_logprobs),
    }
    if request.seed is not None:
        fields["seed"] = int(request.seed) & _MAX_SEED
    if sp.stop:
        fields["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        fields["stop_token_ids"] = [int(t) for t in sp.stop_token_ids]
    if sp.constraint is not None:  # enforced by vLLM's own structured-output backend (xgrammar by default)
        fields["structured_outputs"] = {STRUCTURED_OUTPUT_FIELDS[sp.constraint.kind]: sp.constraint.spec}
    return fields


def generate_body(request: GenerationRequest, rid: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of one ``POST /inference/v1/generate``."""
    return {"request_id": rid, "token_ids": list(request.prompt_ids),
            "sampling_params": {**sampling_fields(request), **(extra or {})}}


def completions_body(request: GenerationRequest, rid: str, model: str | None,
                     extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of one ``POST /v1/completions`` with a token-id prompt."""
    body: dict[str, Any] = {"prompt": list(request.prompt_ids), **sampling_fields(request), "n": 1,
                            "return_tokens_as_token_ids": True, "return_token_ids": True, "request_id": rid}
    if model is not None:
        body["model"] = model
    body.update(extra or {})
    return body


def token_id(token: Any) -> int:
    """The id in a ``"token_id:<id>"`` string (ProtocolError for decoded text)."""
    if isinstance(token, str) and token.startswith(TOKEN_PREFIX):
        try:
            return int(token[len(TOKEN_PREFIX):])
        except ValueError:
            pass
    raise ProtocolError(f"logprob token {token!r} is text, not 'token_id:<id>': the server did not return token "
                        "ids (it ignores return_tokens_as_token_ids); use a vLLM with /inference/v1/generate")


def _logprob(value: Any) -> float:
    return math.nan if value is None else float(value)


def _choice(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError(f"expected a JSON object, got {type(body).__name__}")
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ProtocolError(f"expected one choice (n=1), got {choices!r:.200}")
    return choices[0]


def _finish(choice: dict[str, Any]) -> str:
    reason = choice.get("finish_reason")
    if reason not in FINISH_REASONS:
        raise ProtocolError(f"unknown finish_reason {reason!r}; expected stop, length or abort")
    return FINISH_REASONS[reason]


def _check_ids(ids: Any) -> list[int]:
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        raise ProtocolError("token_ids must be a list of integers")
    return ids


def parse_generate_response(body: Any, top_logprobs: int = 0) -> GenerationResult:
    """One ``/inference/v1/generate`` answer as a :class:`GenerationResult` (no text: the engine decodes).

    ``top_logprobs``: how many the request asked for (0: none; the server then still lists the sampled token
    as its one "top" entry, which is not kept)."""
    choice = _choice(body)
    finish = _finish(choice)
    ids = _check_ids(choice.get("token_ids") or [])
    content = (choice.get("logprobs") or {}).get("content")
    if content is None:
        raise ProtocolError("the answer has no logprobs: the request must set sampling_params.logprobs")
    if len(content) != len(ids):
        raise ProtocolError(f"token_ids ({len(ids)}) and logprobs.content ({len(content)}) differ in length")
    logprobs: list[float] = []
    tops: list[dict[int, float]] = []
    try:
        for token, entry in zip(ids, content):
            said = entry["token_id"] if "token_id" in entry else token_id(entry.get("token"))
            if said != token:
                raise ProtocolError(f"logprobs.content names token {said} where token_ids has {token}")
            logprobs.append(_logprob(entry.get("logprob", -9999.0)))
            if top_logprobs:
                alternatives = entry.get("top_logprobs") or ()
                position = {(alt["token_id"] if "token_id" in alt else token_id(alt.get("token"))):
                            _logprob(alt.get("logprob")) for alt in alternatives}
                if len(alternatives) > 1 and len(position) == 1:
                    raise ProtocolError(
                        "every top logprob is labelled with one token id: this vLLM names each alternative after "
                        "the sampled token, so top logprobs cannot be read from /inference/v1/generate; upgrade "
                        "vLLM, or set engine.api: completions")
                tops.append(position)
    except (TypeError, KeyError, AttributeError) as exc:
        raise ProtocolError(f"malformed logprobs.content entry ({type(exc).__name__}: {exc})") from None
    meta: dict[str, Any] = {"rid": body.get("request_id"), "server_text": False}
    usage = body.get("usage")
    if isinstance(usage, dict):
        meta.update({k: usage[k] for k in ("prompt_tokens", "completion_tokens") if usage.get(k) is not None})
    if choice.get("finish_reason") == "error":
        meta["message"] = "the server ended the request with an error"
    nulls = sum(map(math.isnan, logprobs))
    if nulls:
        meta["null_logprobs"] = nulls
    return GenerationResult(output_ids=ids, logprobs=logprobs, finish_reason=finish, meta=meta,
                            top_logprobs=tops if top_logprobs else None)


def parse_completions_response(body: Any, top_logprobs: int = 0) -> GenerationResult:
    """One ``/v1/completions`` answer (``logprobs`` in the completions shape) as a :class:`GenerationResult`."""
    choice = _choice(body)
    finish = _finish(choice)
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        raise ProtocolError("the answer has no logprobs: the request must set logprobs")
    tokens, values = lp.get("tokens") or [], lp.get("token_logprobs") or []
    if len(tokens) != len(values):
        raise ProtocolError(f"logprobs.tokens ({len(tokens)}) and logprobs.token_logprobs ({len(values)}) differ")
    given = choice.get("token_ids")
    if given is not None:
        ids = _check_ids(given)
        if len(ids) != len(values):
            raise ProtocolError(f"token_ids ({len(ids)}) and logprobs ({len(values)}) differ in length")
        named = [t for t in tokens if isinstance(t, str) and t.startswith(TOKEN_PREFIX)]
        if len(named) == len(tokens) and [token_id(t) for t in tokens] != ids:
            raise ProtocolError("token_ids and the ids in logprobs.tokens disagree")
    else:
        ids = [token_id(t) for t in tokens]
    logprobs = [_logprob(v) for v in values]
    tops = None
    if top_logprobs:
        top = lp.get("top_logprobs") or []
        if len(top) != len(ids):
            raise ProtocolError(f"logprobs.top_logprobs has {len(top)} entries for {len(ids)} tokens")
        tops = [{token_id(t): _logprob(v) for t, v in (entry or {}).items()} for entry in top]
    meta: dict[str, Any] = {"rid": body.get("id"), "server_text": isinstance(choice.get("text"), str)}
    if choice.get("stop_reason") is not None:
        meta["matched"] = choice["stop_reason"]
    nulls = sum(map(math.isnan, logprobs))
    if nulls:
        meta["null_logprobs"] = nulls
    return GenerationResult(output_ids=ids, logprobs=logprobs, finish_reason=finish,
                            text=choice.get("text") or "", meta=meta, top_logprobs=tops)


class GenerateProtocol(WireProtocol):
    """``POST /inference/v1/generate``, for the shared remote client."""

    name = "vllm"
    generate_path = GENERATE_PATH

    def __init__(self, extra: Mapping[str, Any] | None = None):
        self.extra = dict(extra or {})
        self._cache: dict[Any, bytes] = {}  # the sampling params of a SamplingParams, the seed left out
        self._last: tuple[Any, bytes] = (None, b"")

    def encode(self, request: GenerationRequest, rid: str) -> bytes:
        sp = request.sampling
        last, fragment = self._last
        if sp is not last:
            fragment = self._cache.get(sp)  # type: ignore[assignment]
            if fragment is None:
                if len(self._cache) >= 4096:
                    self._cache.clear()
                fields = {**sampling_fields(GenerationRequest("", [], sp)), **self.extra}
                fragment = self._cache[sp] = orjson.dumps(fields)[1:-1]  # the members, without the braces
            self._last = (sp, fragment)
        seed = b"" if request.seed is None else b'"seed":%d,' % (int(request.seed) & _MAX_SEED)
        return b'{"request_id":%b,"token_ids":%b,"sampling_params":{%b%b}}' % (
            orjson.dumps(rid), encode_ids(request.prompt_ids), seed, fragment)

    def parse(self, payload: bytes, rid: str, request: GenerationRequest) -> GenerationResult:
        return parse_generate_response(decode_json(payload), request.sampling.top_logprobs)

    def explain(self, status: int, message: str) -> str:
        if status == 404:
            return "; this vLLM has no /inference/v1/generate: set engine.api: completions"
        return _context_hint(message)


class CompletionsProtocol(WireProtocol):
    """``POST /v1/completions`` with a token-id prompt and token ids back, for the shared remote client."""

    name = "vllm"
    generate_path = COMPLETIONS_PATH

    def __init__(self, model: str | None, extra: Mapping[str, Any] | None = None):
        self.model = model
        self.extra = dict(extra or {})

    def encode(self, request: GenerationRequest, rid: str) -> bytes:
        return orjson.dumps(completions_body(request, rid, self.model, self.extra))

    def parse(self, payload: bytes, rid: str, request: GenerationRequest) -> GenerationResult:
        return parse_completions_response(decode_json(payload), request.sampling.top_logprobs)

    def explain(self, status: int, message: str) -> str:
        return _context_hint(message)


def _context_hint(message: str) -> str:
    if "maximum context length" in message:
        return "; shorten the prompt or sampling.max_tokens, or start vLLM with a larger --max-model-len"
    return ""
