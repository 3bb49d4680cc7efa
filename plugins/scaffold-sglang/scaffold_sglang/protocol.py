"""SGLang's native ``/generate`` protocol: request bodies out, results in.

Pure functions with no I/O, so the engine, the test server and the parse
tests share one definition of the wire format (see the plugin README and
``sglang-api.md`` for the documented behaviour they follow);
:class:`SGLangProtocol` hands them to the shared remote client.

Requests carry ``input_ids`` (never text), an explicit ``sampling_params``
dict that always sets ``max_new_tokens`` and only uses names SGLang knows
(0.5.23 rejects unknown keys with a 400; 0.5.8-0.5.15 answer 500), and
``return_logprob: true`` (plus ``top_logprobs_num`` when the request's
``sampling.top_logprobs`` asks for top logprobs). Responses are read from
``output_ids`` and ``meta_info.output_token_logprobs`` (``[logprob, token_id,
text|null]`` tuples), ``meta_info.output_top_logprobs`` (a list of such
tuples per position), ``meta_info.finish_reason.type`` and
``meta_info.weight_version``; with a server started with
``--enable-metrics``, the request's timing (:func:`server_timing`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson
from scaffold_remote.client import ProtocolError, WireProtocol, decode_json, encode_ids, encode_json
from scaffold_remote.engine import SERVER_TIMING

from scaffold_core.generation import GenerationRequest, GenerationResult

#: Every ``sampling_params`` name native ``/generate`` accepts (sglang 0.5.8 to 0.5.23).
#: Anything else is rejected by the server, so the client refuses it up front.
SAMPLING_KEYS: frozenset[str] = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_new_tokens", "stop", "stop_token_ids", "stop_regex", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "logit_bias", "custom_params", "stream_interval", "sampling_seed",
})

#: Keys the client always derives from scaffold's own sampling parameters.
MANAGED_SAMPLING_KEYS: frozenset[str] = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "sampling_seed", "n",
})

FINISH_TYPES = ("stop", "length", "abort")
_MAX_SEED = (1 << 63) - 1


def check_extra_sampling(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate user-supplied extra sampling params (``engine.sampling_extra``); return a copy."""
    out = dict(extra or {})
    unknown = sorted(k for k in out if k not in SAMPLING_KEYS)
    if unknown:
        raise ValueError(
            f"unknown SGLang sampling parameter(s) {', '.join(map(repr, unknown))}; SGLang rejects them. "
            f"Allowed: {', '.join(sorted(SAMPLING_KEYS - MANAGED_SAMPLING_KEYS))}")
    managed = sorted(k for k in out if k in MANAGED_SAMPLING_KEYS)
    if managed:
        raise ValueError(
            f"{', '.join(map(repr, managed))} come from the run's `sampling:` section (max_tokens, temperature, "
            "top_p, top_k, stop, stop_token_ids, seed); set them there, not in engine.sampling_extra")
    return out


def sampling_params(request: GenerationRequest, *, send_seed: bool = False,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``sampling_params`` dict for one request.

    ``max_tokens`` becomes ``max_new_tokens`` and is always sent (a server
    default must never cut responses short). ``temperature``, ``top_p`` and
    ``top_k`` are always sent too (``/generate`` ignores the model's
    generation config). The request's seed is sent as ``sampling_seed`` only
    when ``send_seed`` is set: SGLang honours it only with
    ``--enable-deterministic-inference``, and there is no ``seed`` key. A
    ``sampling.constraint`` is sent as SGLang's native parameter of the same
    name (``json_schema``, ``regex``, ``ebnf`` or ``structural_tag``), which
    its grammar backend (xgrammar by default) enforces.
    """
    sp = request.sampling
    params: dict[str, Any] = {
        "max_new_tokens": int(sp.max_tokens),
        "temperature": float(sp.temperature),
        "top_p": float(sp.top_p),
        "top_k": int(sp.top_k),
    }
    if sp.stop:
        params["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        params["stop_token_ids"] = [int(t) for t in sp.stop_token_ids]
    if send_seed and request.seed is not None:
        params["sampling_seed"] = int(request.seed) & _MAX_SEED
    if extra:
        params.update(extra)
    if sp.constraint is not None:
        params[sp.constraint.kind] = sp.constraint.spec
    return params


def generate_body(request: GenerationRequest, rid: str, *, send_seed: bool = False,
                  extra_sampling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of one ``POST /generate`` (one prompt, one sample, logprobs on)."""
    body: dict[str, Any] = {
        "input_ids": list(request.prompt_ids),
        "rid": rid,
        "sampling_params": sampling_params(request, send_seed=send_seed, extra=extra_sampling),
        "return_logprob": True,
    }
    if request.sampling.top_logprobs > 0:
        body["top_logprobs_num"] = int(request.sampling.top_logprobs)
    return body


class BodyEncoder:
    """Encodes ``/generate`` bodies fast: byte-for-byte what ``encode_json(generate_body(...))`` gives.

    The ``sampling_params`` JSON of a :class:`SamplingParams` (frozen, so
    hashable) is encoded once and reused (the last one by identity, without
    hashing it again); only the prompt ids and the rid are encoded per
    request.
    """

    def __init__(self, *, send_seed: bool = False, extra_sampling: Mapping[str, Any] | None = None,
                 cache_size: int = 4096):
        self.send_seed = send_seed
        self.extra = dict(extra_sampling or {})
        self.cache_size = cache_size
        self._sampling: dict[Any, bytes] = {}
        self._last: tuple[Any, bytes] = (None, b"")

    def encode(self, request: GenerationRequest, rid: str) -> bytes:
        if (self.send_seed and request.seed is not None) or request.sampling.top_logprobs > 0:  # the general path
            return encode_json(generate_body(request, rid, send_seed=self.send_seed, extra_sampling=self.extra))
        sp = request.sampling
        last, fragment = self._last
        if sp is not last:
            cached = self._sampling.get(sp)
            if cached is None:
                if len(self._sampling) >= self.cache_size:
                    self._sampling.clear()
                cached = self._sampling[sp] = encode_json(sampling_params(request, extra=self.extra))
            fragment = cached
            self._last = (sp, fragment)
        return b'{"input_ids":%b,"rid":%b,"sampling_params":%b,"return_logprob":true}' % (
            encode_ids(request.prompt_ids), orjson.dumps(rid) if rid.isascii() else encode_json(rid), fragment)


_INT_ONLY = frozenset({int})


def parse_generate_response(body: Any, *, expect_rid: str | None = None) -> GenerationResult:  # noqa: C901
    """Turn one non-streaming ``/generate`` response object into a :class:`GenerationResult`.

    ``output_ids`` are the server's sampled ids (a matched EOS/stop token
    included) and ``logprobs`` the first element of each
    ``output_token_logprobs`` tuple. Raises :class:`ProtocolError` when the
    body is not a final single-prompt response with logprobs, or when the
    ids in ``output_ids`` and in the logprob tuples disagree.
    """
    if isinstance(body, list):
        raise ProtocolError(f"expected one response object, got a JSON array of {len(body)} (a batch or n > 1)")
    if not isinstance(body, dict):
        raise ProtocolError(f"expected a JSON object, got {type(body).__name__}")
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise ProtocolError("response has no meta_info object")
    finish = meta.get("finish_reason")
    if finish is None:
        raise ProtocolError("response has finish_reason null: a non-final (streaming) frame, not a result")
    if isinstance(finish, str):  # tolerate a bare string, as the OpenAI endpoints send
        finish = {"type": finish}
    ftype = finish.get("type") if isinstance(finish, dict) else None
    if ftype not in FINISH_TYPES:
        raise ProtocolError(f"unknown finish_reason {finish!r}; expected type stop, length or abort")

    tuples = meta.get("output_token_logprobs")
    output_ids = body.get("output_ids")
    if tuples is None:
        if ftype == "abort" and not output_ids:
            tuples = []
        else:
            raise ProtocolError("response has no meta_info.output_token_logprobs: the request must set "
                                "return_logprob: true")
    if not isinstance(tuples, list):
        raise ProtocolError(f"meta_info.output_token_logprobs must be a list, got {type(tuples).__name__}")
    try:
        logprobs = [t[0] for t in tuples]
        tuple_ids = [t[1] for t in tuples]
        try:
            total = sum(logprobs)  # fast, and NaN when any value is NaN
        except TypeError:
            # 0.5.23 serialises NaN/Inf as null: keep "no value" visible as NaN rather than inventing one.
            logprobs = [math.nan if lp is None else float(lp) for lp in logprobs]
            total = math.nan
        else:
            logprobs = list(map(float, logprobs))
    except (TypeError, IndexError, ValueError) as exc:
        raise ProtocolError(f"malformed output_token_logprobs entry ({exc}); expected [logprob, token_id, text]") \
            from None
    if output_ids is None:
        output_ids = tuple_ids
    elif ftype == "abort" and len(output_ids) != len(tuple_ids):
        n = min(len(output_ids), len(tuple_ids))  # partial output of an aborted request: keep the paired part
        output_ids, logprobs, tuple_ids = output_ids[:n], logprobs[:n], tuple_ids[:n]
    if output_ids != tuple_ids:
        raise ProtocolError(
            f"output_ids ({len(output_ids)} ids) and the ids in output_token_logprobs ({len(tuple_ids)}) "
            "disagree; the server's response is inconsistent")
    if not _INT_ONLY.issuperset(map(type, output_ids)):
        raise ProtocolError("output token ids must be integers")

    rid = meta.get("id")
    if expect_rid is not None and rid is not None and rid != expect_rid:
        raise ProtocolError(f"response is for request id {rid!r}, not {expect_rid!r}")
    info: dict[str, Any] = {"rid": rid}
    for key in ("prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency", "weight_versions"):
        if meta.get(key) is not None:
            info[key] = meta[key]
    retractions = meta.get("num_retractions", meta.get("total_retractions"))
    if retractions:
        info["num_retractions"] = retractions
    if isinstance(finish, dict):
        if "matched" in finish and finish["matched"] is not None:
            info["matched"] = finish["matched"]
        if ftype == "abort":
            info["message"] = str(finish.get("message") or "aborted by the server")
            if finish.get("status_code") is not None:
                info["status_code"] = finish["status_code"]
    timing = server_timing(meta, len(output_ids))
    if timing is not None:
        info[SERVER_TIMING] = timing
    null_logprobs = sum(map(math.isnan, logprobs)) if total != total else 0
    if null_logprobs:
        info["null_logprobs"] = null_logprobs
    text = body.get("text")
    info["server_text"] = isinstance(text, str)
    return GenerationResult(
        output_ids=output_ids, logprobs=logprobs, finish_reason=ftype,
        text=text if isinstance(text, str) else "", weight_version=meta.get("weight_version"), meta=info,
        top_logprobs=parse_top_logprobs(meta.get("output_top_logprobs"), len(output_ids)),
    )


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < math.inf):
        return None
    return float(value)


def server_timing(meta: Mapping[str, Any], completion_tokens: int) -> dict[str, float] | None:
    """How long the server's parts of one request took, from ``meta_info`` (seconds; the remote engine turns
    them into the request's spans): ``decode`` from the first token to the last, then ``queued`` (waiting for
    the scheduler: tokenizing and dispatch included) and ``prefill``, or, without the scheduler's time,
    ``first_token`` (both together). None when the server says too little: SGLang adds ``decode_throughput``
    (and, from some versions, ``inference_time``: from leaving the queue to the end) only when started with
    ``--enable-metrics``; ``e2e_latency`` is always there.

    ``decode_throughput`` is the tokens after the first over the decode time (``completion_tokens - 1``;
    some versions count all of them: the time is then one token's too short)."""
    e2e = _seconds(meta.get("e2e_latency"))
    rate = _seconds(meta.get("decode_throughput"))
    if e2e is None or not rate or completion_tokens < 2:
        return None
    decode = min(e2e, (completion_tokens - 1) / rate)
    inference = _seconds(meta.get("inference_time"))
    if inference is not None and decode <= inference <= e2e:
        return {"queued": e2e - inference, "prefill": inference - decode, "decode": decode}
    return {"first_token": e2e - decode, "decode": decode}


def parse_top_logprobs(entries: Any, n: int) -> list[dict[int, float]] | None:
    """``meta_info.output_top_logprobs`` as one ``{token_id: logprob}`` dict per output position.

    ``None`` when the server sent none (the request did not ask). A ``null``
    position becomes an empty dict, and a ``null`` logprob (NaN or infinity
    serialised by orjson) is NaN. An aborted request's list may be longer than
    its kept output: it is cut to ``n`` positions.
    """
    if entries is None:
        return None
    if not isinstance(entries, list) or len(entries) < n:
        raise ProtocolError(f"meta_info.output_top_logprobs must be a list with one entry per output token ({n}), "
                            f"got {type(entries).__name__} of {len(entries) if isinstance(entries, list) else '?'}")
    out: list[dict[int, float]] = []
    for entry in entries[:n]:
        position: dict[int, float] = {}
        if entry is not None:
            try:
                for item in entry:
                    token = item[1]
                    if type(token) is not int:
                        raise TypeError("token id is not an integer")
                    position[token] = math.nan if item[0] is None else float(item[0])
            except (TypeError, IndexError, ValueError) as exc:
                raise ProtocolError(f"malformed output_top_logprobs entry ({exc}); expected a list of "
                                    "[logprob, token_id, text] tuples") from None
        out.append(position)
    return out


class SGLangProtocol(WireProtocol):
    """``POST /generate`` with ``input_ids`` and ``return_logprob``, for the shared remote client."""

    name = "sglang"
    generate_path = "/generate"

    def __init__(self, *, send_seed: bool = False, extra_sampling: Mapping[str, Any] | None = None):
        self._encoder = BodyEncoder(send_seed=send_seed, extra_sampling=extra_sampling)

    def encode(self, request: GenerationRequest, rid: str) -> bytes:
        return self._encoder.encode(request, rid)

    def parse(self, payload: bytes, rid: str, request: GenerationRequest) -> GenerationResult:
        return parse_generate_response(decode_json(payload), expect_rid=rid)

    def explain(self, status: int, message: str) -> str:
        if status == 400 and "unknown field" in message:
            return "; a sampling parameter is not supported by this SGLang version (see engine.sampling_extra)"
        return ""
