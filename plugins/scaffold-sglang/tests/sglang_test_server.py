"""A protocol test server for SGLang's native HTTP API (tests and benchmarks only; no GPU, no sglang).

It implements the documented behaviour of ``/generate`` (input ids, sampling
params validated like sglang 0.5.23 or 0.5.8, logprob tuples, finish reasons,
``n``, batches, duplicate rids, context-length errors), ``/health``,
``/health_generate``, ``/ready``, ``/model_info``, ``/server_info``,
``/flush_cache``, ``/update_weights_from_disk``, ``/pause_generation``,
``/continue_generation``, ``/abort_request`` and API-key checks, with the
error bodies SGLang sends.

Tokens come from a *backend*:

* ``random`` (default): deterministic pseudo-random tokens from an RNG seeded
  per request (greedy requests by the prompt alone, sampled ones by the
  ``sampling_seed`` or else the rid), fast enough for a client benchmark.
  With ``--tokenizer-path builtin:byte`` (scaffold's byte tokenizer; use
  ``--vocab-size 262``) responses carry ``text`` and stop strings end
  generation, as in SGLang; with any other tokenizer, or with
  ``--skip-tokenizer-init``, there is no ``text`` and stop strings are
  ignored (as SGLang with ``--skip-tokenizer-init``).
* ``transformers``: scaffold's embedded engine (a real model on CPU).

Run it exactly like ``python -m sglang.launch_server`` (same flag spelling for
the flags it knows), e.g.::

    python sglang_test_server.py --model-path HuggingFaceTB/SmolLM2-135M-Instruct --port 30000

Test-only flags simulate slow starts, servers that never become ready,
crashes, per-token latency and injected 5xx answers.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import hashlib
import hmac
import json
import os
import random
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

SAMPLING_KEYS = (
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_new_tokens", "stop", "stop_token_ids", "stop_regex", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "logit_bias", "custom_params", "stream_interval", "sampling_seed",
)
FLOAT_KEYS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
INT_KEYS = ("max_new_tokens", "top_k", "min_new_tokens", "n", "sampling_seed", "stream_interval")
HEALTH_PATHS = ("/health", "/health_generate", "/ready")
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


class BadRequest(Exception):
    """Becomes an HTTP error response with SGLang's body shape."""

    def __init__(self, status: int, body: Any):
        super().__init__(str(body))
        self.status = status
        self.body = body


def _message(text: str) -> dict[str, Any]:
    return {"error": {"message": text}}


@dataclass(eq=False)
class Live:
    """One request being generated."""

    rid: str
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    abort_message: str = "Aborted"
    retractions: int = 0


# ---------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------


class RandomBackend:
    """Deterministic pseudo-random tokens: a function of the prompt (and the rid when sampling)."""

    def __init__(self, *, vocab_size: int, eos_token_id: int, mean_tokens: int, token_delay_s: float, seed: int):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.mean_tokens = max(1, mean_tokens)
        self.token_delay_s = token_delay_s
        self.seed = seed

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def encode_text(self, text: str) -> list[int]:
        return [3 + b for b in text.encode("utf-8")]

    def _rng(self, input_ids: list[int], params: dict[str, Any], rid: str) -> random.Random:
        h = hashlib.blake2b(array.array("q", input_ids).tobytes(), digest_size=8, key=str(self.seed).encode())
        if params["temperature"] >= 1e-6:  # sampled: each request draws its own tokens
            seed = params.get("sampling_seed")
            h.update(str(seed).encode() if seed is not None else rid.encode())
        return random.Random(int.from_bytes(h.digest(), "big"))

    async def generate(self, server: TestServer, live: Live, input_ids: list[int], params: dict[str, Any]
                       ) -> tuple[list[int], list[float], dict[str, Any], str | None]:
        rng = self._rng(input_ids, params, live.rid)
        natural = rng.randint(1, 2 * self.mean_tokens)
        stop_ids = set(params.get("stop_token_ids") or ())
        decode = server.decode
        stops = params.get("stop") or ()
        stops = [stops] if isinstance(stops, str) else [t for t in stops if t]
        text: str | None = None
        ignore_eos = bool(params.get("ignore_eos"))
        if not ignore_eos:
            stop_ids.add(self.eos_token_id)
        max_new = params["max_new_tokens"]
        ids: list[int] = []
        logprobs: list[float] = []
        finish: dict[str, Any] | None = None
        while finish is None:
            if len(ids) >= max_new:
                finish = {"type": "length", "length": max_new}
                break
            if self.token_delay_s:
                await server.step_gate(live, self.token_delay_s)
            if live.abort.is_set():
                finish = {"type": "abort", "message": live.abort_message, "status_code": None, "err_type": None}
                break
            if len(ids) + 1 == natural and not ignore_eos:
                token = self.eos_token_id
            else:
                token = rng.randrange(3, self.vocab_size)
            ids.append(token)
            logprobs.append(-round(rng.random() * 4.0, 6) - 1e-3)
            if token in stop_ids:
                finish = {"type": "stop", "matched": token}
            elif decode is not None and stops:
                decoded = decode(ids, skip_special_tokens=True)
                hits = [(decoded.find(t), t) for t in stops if t in decoded]
                if hits:
                    at, matched = min(hits)
                    finish, text = {"type": "stop", "matched": matched}, decoded[:at]
        if decode is not None and text is None:
            text = decode(ids, skip_special_tokens=True)
        return ids, logprobs, finish, text


class TransformersBackend:
    """scaffold's embedded transformers engine (a real model, CPU); responses carry text."""

    def __init__(self, model: str | None, max_batch_size: int = 8):
        from scaffold_core.engines.transformers_engine import TransformersEngine

        self.engine = TransformersEngine(model=model, max_batch_size=max_batch_size, threads=1)

    async def start(self) -> None:
        await self.engine.start()
        self.eos_token_id = self.engine.tokenizer.eos_token_id
        self.vocab_size = len(self.engine.tokenizer)

    async def close(self) -> None:
        await self.engine.close()

    def encode_text(self, text: str) -> list[int]:
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

    async def generate(self, server: TestServer, live: Live, input_ids: list[int], params: dict[str, Any]
                       ) -> tuple[list[int], list[float], dict[str, Any], str | None]:
        from scaffold_core.generation import GenerationRequest
        from scaffold_core.sampling import SamplingParams

        stop = params.get("stop") or ()
        sp = SamplingParams(max_tokens=max(1, params["max_new_tokens"]), temperature=params["temperature"],
                            top_p=params["top_p"], top_k=params["top_k"],
                            stop=(stop,) if isinstance(stop, str) else tuple(stop),
                            stop_token_ids=tuple(params.get("stop_token_ids") or ()),
                            seed=params.get("sampling_seed"))
        request = GenerationRequest(live.rid, input_ids, sp, seed=params.get("sampling_seed"))
        gen = asyncio.ensure_future(self.engine.generate(request))
        aborted = asyncio.ensure_future(live.abort.wait())
        try:
            await asyncio.wait([gen, aborted], return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
        if not gen.done():
            gen.cancel()
            return [], [], {"type": "abort", "message": live.abort_message, "status_code": None,
                            "err_type": None}, ""
        result = gen.result()
        if result.finish_reason == "stop":
            last = result.output_ids[-1] if result.output_ids else None
            finish = {"type": "stop", "matched": last}
        else:
            finish = {"type": "length", "length": len(result.output_ids)}
        return list(result.output_ids), list(result.logprobs), finish, result.text


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------


class TestServer:
    """State and handlers of one test server (usable in-process or as a subprocess)."""

    def __init__(self, *, model_path: str = DEFAULT_MODEL, backend: Any = None, api_key: str | None = None,
                 weight_version: str = "default", context_length: int = 8192, compat: str = "0.5.23",
                 warmup_delay_s: float = 0.0, never_ready: bool = False, record: str | None = None,
                 fail_first: int = 0, fail_status: int = 503, tokenizer_path: str | None = None,
                 port: int | None = None, tp_size: int = 1, skip_tokenizer_init: bool = False):
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path or model_path
        self.decode = None  # the random backend's detokenizer, when it has one
        if self.tokenizer_path == "builtin:byte" and not skip_tokenizer_init:
            from scaffold_core.tokenizers import ByteTokenizer

            self.decode = ByteTokenizer().decode
        self.skip_tokenizer_init = skip_tokenizer_init
        self.backend = backend or RandomBackend(vocab_size=49152, eos_token_id=2, mean_tokens=16,
                                                token_delay_s=0.0, seed=0)
        self.api_key = api_key
        self.weight_version = weight_version
        self.context_length = context_length
        self.compat = compat
        self.compat_v = tuple(int(x) for x in compat.split(".")[:3])
        self.never_ready = never_ready
        self.ready_at = time.monotonic() + warmup_delay_s
        self.port = port
        self.tp_size = tp_size
        self.live: dict[str, Live] = {}
        self.waiting = 0
        self.resume = asyncio.Event()
        self.resume.set()
        self.paused_mode: str | None = None
        self.drained = asyncio.Event()
        self.drained.set()
        self.fail_remaining = fail_first
        self.fail_status = fail_status
        self.requests_seen = 0
        self.responses: list[dict[str, Any]] = []
        self.control_log: list[tuple[str, dict[str, Any]]] = []
        self.auth_headers: list[tuple[str, str | None]] = []
        self._record = open(record, "a", encoding="utf-8", buffering=1) if record else None

    # -- helpers ------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        if self.compat_v >= (0, 5, 16):
            r.add_get("/ready", self.ready)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/update_weight_version", self.update_weight_version)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_post("/abort_request", self.abort_request)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, app: web.Application) -> None:
        if self._record is not None:
            self._record.close()
            self._record = None

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path not in HEALTH_PATHS:
            header = request.headers.get("Authorization")
            self.auth_headers.append((request.path, header))
            if self.api_key is not None:
                expected = f"Bearer {self.api_key}"
                if header is None or not hmac.compare_digest(header.encode(), expected.encode()):
                    return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    @property
    def is_up(self) -> bool:
        return not self.never_ready and time.monotonic() >= self.ready_at

    async def step_gate(self, live: Live, delay: float) -> None:
        """Per-token pacing (an abort cuts it short); a paused (retract / in_place) request waits here."""
        try:
            await asyncio.wait_for(live.abort.wait(), delay)
        except asyncio.TimeoutError:
            pass
        if not self.resume.is_set() and not live.abort.is_set():
            if self.paused_mode == "retract":
                live.retractions += 1
            await self._until_continued_or_aborted(live)

    async def _until_continued_or_aborted(self, live: Any) -> None:
        """Wait until generation continues (after a pause) or this request is aborted."""
        waiter = asyncio.ensure_future(self.resume.wait())
        aborted = asyncio.ensure_future(live.abort.wait())
        try:
            await asyncio.wait([waiter, aborted], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            aborted.cancel()

    async def _json(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise BadRequest(400, {"object": "error", "message": f"JSON decode error: {exc}", "type": "Bad Request",
                                  "param": None, "code": 400}) from None

    # -- /generate ------------------------------------------------------------
    def _check_sampling(self, params: Any) -> dict[str, Any]:
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise BadRequest(400, {"error": f"invalid type: {type(params).__name__}, expected struct SamplingParams"})
        for key, value in params.items():
            if key not in SAMPLING_KEYS:
                if self.compat_v >= (0, 5, 16):
                    expected = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
                    raise BadRequest(400, {"error": f"unknown field `{key}`, expected one of {expected}"})
                raise BadRequest(500, "Internal Server Error")
            if value is None:
                continue
            if key in FLOAT_KEYS and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise BadRequest(400, {"error": f"invalid type: {type(value).__name__} {json.dumps(value)}, "
                                                "expected f64"})
            if key in INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
                raise BadRequest(400, {"error": f"invalid type: {type(value).__name__} {json.dumps(value)}, "
                                                "expected i64"})
            if key == "stop_token_ids" and not (isinstance(value, list)
                                                and all(isinstance(t, int) and not isinstance(t, bool)
                                                        for t in value)):
                raise BadRequest(400, {"error": "invalid type: expected a sequence of integers for stop_token_ids"})
        out = {"max_new_tokens": 128, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "n": 1, **params}
        if out["temperature"] < 0:
            raise BadRequest(400, _message(f"temperature must be non-negative, got {out['temperature']}."))
        if not 0 < out["top_p"] <= 1:
            raise BadRequest(400, _message(f"top_p must be in (0, 1], got {out['top_p']}."))
        if out["top_k"] != -1 and out["top_k"] < 1:
            raise BadRequest(400, _message(f"top_k must be -1 (disable) or at least 1, got {out['top_k']}."))
        if out["max_new_tokens"] is not None and out["max_new_tokens"] < 0:
            raise BadRequest(400, _message(f"max_new_tokens must be at least 0, got {out['max_new_tokens']}."))
        if out["n"] < 1:
            raise BadRequest(400, _message(f"n must be at least 1, got {out['n']}."))
        return out

    def _prompts(self, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
        given = [k for k in ("text", "input_ids", "input_embeds") if body.get(k) is not None]
        if len(given) != 1:
            raise BadRequest(400, _message("Either text, input_ids or input_embeds should be provided."))
        if given[0] == "input_embeds":
            raise BadRequest(400, _message("The test server does not support input_embeds."))
        if given[0] == "text":
            text = body["text"]
            if isinstance(text, str):
                return [self.backend.encode_text(text)], False
            if isinstance(text, list) and all(isinstance(t, str) for t in text):
                return [self.backend.encode_text(t) for t in text], True
            raise BadRequest(400, {"object": "error", "message": "text: Input should be a valid string",
                                  "type": "Bad Request", "param": None, "code": 400})
        ids = body["input_ids"]
        if isinstance(ids, list) and not ids:
            raise BadRequest(400, _message("input_ids cannot be empty."))
        if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return [ids], False
        if isinstance(ids, list) and all(isinstance(p, list) and p and all(isinstance(t, int) for t in p)
                                         for p in ids):
            return ids, True
        raise BadRequest(400, {"object": "error", "message": "input_ids: Input should be a valid list of integers",
                              "type": "Bad Request", "param": None, "code": 400})

    async def generate(self, request: web.Request) -> web.StreamResponse:  # noqa: C901
        started = time.perf_counter()
        self.requests_seen += 1
        try:
            body = await self._json(request)
            if not isinstance(body, dict):
                raise BadRequest(400, {"object": "error", "message": "body must be a JSON object",
                                      "type": "Bad Request", "param": None, "code": 400})
            if self.fail_remaining > 0:
                self.fail_remaining -= 1
                raise BadRequest(self.fail_status, {"object": "error", "message": "injected failure",
                                                    "type": str(self.fail_status), "param": None,
                                                    "code": self.fail_status})
            prompts, batch = self._prompts(body)
            params_in = body.get("sampling_params")
            per_item = params_in if isinstance(params_in, list) else [params_in] * len(prompts)
            if len(per_item) != len(prompts):
                raise BadRequest(400, _message("sampling_params list length must match the batch size."))
            params_list = [self._check_sampling(p) for p in per_item]
            ns = {p["n"] for p in params_list}
            if len(ns) > 1:
                raise BadRequest(400, _message("The parallel_sample_num should be the same for all samples."))
            n = ns.pop()
            for prompt, params in zip(prompts, params_list):
                if len(prompt) >= self.context_length:
                    raise BadRequest(400, _message(f"The input ({len(prompt)} tokens) is longer than the model's "
                                                   f"context length ({self.context_length} tokens)."))
                if params["max_new_tokens"] is None:
                    params["max_new_tokens"] = self.context_length - len(prompt) - 1
                elif len(prompt) + params["max_new_tokens"] > self.context_length:
                    total = len(prompt) + params["max_new_tokens"]
                    raise BadRequest(400, _message(
                        f"Requested token count exceeds the model's maximum context length of "
                        f"{self.context_length} tokens. You requested a total of {total} tokens: {len(prompt)} "
                        f"tokens from the input messages and {params['max_new_tokens']} tokens for the "
                        "completion."))
            rid = body.get("rid")
            count = len(prompts) * n
            if isinstance(rid, list):
                if len(rid) != len(prompts):
                    raise BadRequest(400, _message("The rid list length must match the batch size."))
                rids = list(rid)
            elif rid is None or n > 1:
                rids = [os.urandom(16).hex() for _ in range(count)]
            elif batch:
                rids = [f"{rid}_{i}" for i in range(len(prompts))]
            else:
                rids = [str(rid)]
            if n > 1 and isinstance(rid, list):
                rids = [os.urandom(16).hex() for _ in range(count)]
            for r in rids:
                if r in self.live:
                    raise BadRequest(400, _message(f"Duplicate request ID detected: {r}"))
            want_logprob = body.get("return_logprob", False)
            jobs = []
            for i, (prompt, params) in enumerate(zip(prompts, params_list)):
                for j in range(n):
                    jobs.append(self._one(rids[i * n + j], prompt, params, want_logprob, started))
            outs = await asyncio.gather(*jobs) if len(jobs) > 1 else [await jobs[0]]
        except BadRequest as exc:
            if isinstance(exc.body, str):
                return web.Response(status=exc.status, text=exc.body)
            return web.json_response(exc.body, status=exc.status)
        payload = outs if (batch or n > 1) else outs[0]
        return web.Response(body=json.dumps(payload, separators=(",", ":")).encode(),
                            content_type="application/json")

    async def _one(self, rid: str, prompt: list[int], params: dict[str, Any], want_logprob: Any,
                   started: float) -> dict[str, Any]:
        live = Live(rid)
        self.live[rid] = live
        self.drained.clear()
        try:
            if not self.resume.is_set():  # paused: new requests wait inside the server until continue
                self.waiting += 1
                try:
                    await self._until_continued_or_aborted(live)
                finally:
                    self.waiting -= 1
            if live.abort.is_set():
                ids, logprobs, finish, text = [], [], {"type": "abort", "message": "Abort in waiting queue"}, None
            else:
                ids, logprobs, finish, text = await self.backend.generate(self, live, prompt, params)
        finally:
            del self.live[rid]
            if not self.live:
                self.drained.set()
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": finish, "prompt_tokens": len(prompt), "completion_tokens": len(ids),
            "cached_tokens": 0, "weight_version": self.weight_version,
            "e2e_latency": time.perf_counter() - started,
        }
        meta["num_retractions" if self.compat_v >= (0, 5, 15) else "total_retractions"] = live.retractions
        if want_logprob:
            meta["input_token_logprobs"] = [[None, prompt[-1], None]]
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids)]
        out: dict[str, Any] = {"output_ids": ids, "meta_info": meta}
        if text is not None and not self.skip_tokenizer_init:
            out = {"text": text, **out}
        self.responses.append({"rid": rid, "input_ids": prompt, "output_ids": ids, "logprobs": logprobs,
                               "finish_reason": finish["type"], "weight_version": self.weight_version})
        if self._record is not None:
            self._record.write(json.dumps(self.responses[-1]) + "\n")
        return out

    # -- health and info --------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        ok = self.is_up and self.resume.is_set()
        return web.Response(status=200 if ok else 503)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.is_up and self.resume.is_set() else 503)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path, "tokenizer_path": self.tokenizer_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": self.weight_version,
            "has_image_understanding": False, "has_audio_understanding": False, "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        })

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path, "port": self.port, "tp_size": self.tp_size,
            "context_length": self.context_length, "max_req_input_len": self.context_length - 1,
            "max_total_num_tokens": 1 << 20, "version": f"{self.compat}+scaffold-test-server",
            "internal_states": [{}], "status": "Up" if self.is_up else "Starting",
        })

    # -- control ----------------------------------------------------------------
    def _abort_all(self, message: str = "Aborted") -> int:
        for live in self.live.values():
            live.abort_message = message
            live.abort.set()
        return len(self.live)

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.control_log.append(("flush_cache", {}))
        if self.live or self.waiting:
            return web.Response(status=400, text="Flush cache failed: requests are running or queued.")
        return web.Response(status=200, text="Cache flushed.")

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
        except BadRequest as exc:
            return web.json_response(exc.body, status=exc.status)
        self.control_log.append(("update_weights_from_disk", dict(body)))
        path = body.get("model_path")
        if not isinstance(path, str) or not (path == self.model_path or os.path.exists(path)):
            return web.json_response({"success": False, "message": f"Failed to get weights iterator: {path} "
                                      "(repository not found).", "num_paused_requests": 0}, status=400)
        if body.get("abort_all_requests"):
            self._abort_all()
        if self.resume.is_set():  # not paused: wait for running requests (the writer side of the lock)
            await self.drained.wait()
        self.model_path = path
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                                  "num_paused_requests": 0})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self.control_log.append(("update_weight_version", dict(body)))
        if body.get("abort_all_requests", True):
            self._abort_all()
        self.weight_version = str(body.get("new_version"))
        return web.json_response({"success": True, "message": f"Weight version updated to {self.weight_version}",
                                  "new_version": self.weight_version})

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        mode = body.get("mode", "abort")
        self.control_log.append(("pause_generation", dict(body)))
        if mode not in ("abort", "retract", "in_place"):
            return web.json_response(_message(f"Invalid pause mode {mode!r}"), status=400)
        self.paused_mode = mode
        self.resume.clear()
        if mode == "abort":
            self._abort_all()
            await asyncio.wait_for(self.drained.wait(), 30)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self.control_log.append(("continue_generation", dict(body)))
        self.paused_mode = None
        self.resume.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self.control_log.append(("abort_request", dict(body)))
        if body.get("abort_all"):
            self._abort_all()
        elif isinstance(body.get("rid"), str):
            for rid, live in self.live.items():
                if rid.startswith(body["rid"]):  # SGLang matches by prefix
                    live.abort.set()
        return web.Response(status=200)


# ---------------------------------------------------------------------------
# In-process use (tests) and the command line (subprocess tests, benchmarks)
# ---------------------------------------------------------------------------


class running:
    """``async with running(TestServer(...)) as url:`` serves it on an ephemeral loopback port."""

    def __init__(self, server: TestServer, host: str = "127.0.0.1", port: int = 0):
        self.server = server
        self.host = host
        self.port = port

    async def __aenter__(self) -> str:
        await self.server.backend.start()
        self.runner = web.AppRunner(self.server.app(), access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        self.server.port = self.port
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def __aexit__(self, *exc: object) -> None:
        self.server._abort_all("server shutting down")
        self.server.resume.set()
        await self.runner.cleanup()
        await self.server.backend.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Flags spelled as in sglang.launch_server.
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--tokenizer-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--nccl-port", type=int)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--api-key")
    p.add_argument("--weight-version", default="default")
    p.add_argument("--context-length", type=int, default=8192)
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--log-level", default="info")
    # Test-only flags.
    p.add_argument("--backend", choices=("random", "transformers"), default="random")
    p.add_argument("--compat", default="0.5.23", help="sglang version to imitate where versions differ")
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--eos-token-id", type=int, default=2)
    p.add_argument("--mean-tokens", type=int, default=16)
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    p.add_argument("--load-delay", type=float, default=0.0, help="seconds before the port listens")
    p.add_argument("--warmup-delay", type=float, default=0.0, help="seconds of 503 from /health after listening")
    p.add_argument("--never-ready", action="store_true", help="/health answers 503 forever")
    p.add_argument("--crash-after-load", action="store_true", help="print an error and exit 1 instead of serving")
    p.add_argument("--fail-first", type=int, default=0, help="answer the first N /generate with --fail-status")
    p.add_argument("--fail-status", type=int, default=503)
    p.add_argument("--record", help="append every /generate result to this JSONL file")
    p.add_argument("--pid-file", help="write this process's pid here once listening")
    p.add_argument("--reuse-port-workers", type=int, default=1,
                   help="serve from N processes sharing the port (SO_REUSEPORT), for benchmarks")
    return p.parse_args(argv)


def _hold_port(host: str, port: int) -> socket.socket:
    """Bind and listen on ``port`` the way SGLang's torch.distributed store holds --nccl-port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, port))
    s.listen(8)
    return s


async def serve(args: argparse.Namespace) -> int:
    log = print
    log(f"test server: model {args.model_path}, backend {args.backend}, host {args.host}, port {args.port}, "
        f"nccl port {args.nccl_port}, tp {args.tp_size}, base gpu {args.base_gpu_id}", flush=True)
    held: list[socket.socket] = []
    try:
        if args.nccl_port is not None:
            held.append(_hold_port(args.host, args.nccl_port))
    except OSError as exc:
        log(f"ERROR: cannot bind nccl port {args.nccl_port}: {exc}", flush=True)
        return 1
    if args.load_delay:
        await asyncio.sleep(args.load_delay)
    if args.crash_after_load:
        log("ERROR: simulated crash while loading the model (RuntimeError: CUDA out of memory)", flush=True)
        return 1
    if args.backend == "transformers":
        model = None if args.model_path == DEFAULT_MODEL else args.model_path
        backend: Any = TransformersBackend(model)
    else:
        backend = RandomBackend(vocab_size=args.vocab_size, eos_token_id=args.eos_token_id,
                                mean_tokens=args.mean_tokens, token_delay_s=args.token_delay_ms / 1000.0,
                                seed=args.random_seed)
    server = TestServer(model_path=args.model_path, backend=backend, api_key=args.api_key,
                        weight_version=args.weight_version, context_length=args.context_length,
                        compat=args.compat, warmup_delay_s=0.0 if args.skip_server_warmup else args.warmup_delay,
                        never_ready=args.never_ready, record=args.record, fail_first=args.fail_first,
                        fail_status=args.fail_status, tokenizer_path=args.tokenizer_path, port=args.port,
                        tp_size=args.tp_size, skip_tokenizer_init=args.skip_tokenizer_init)
    await backend.start()
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_port=args.reuse_port_workers > 1, backlog=4096)
    try:
        await site.start()
    except OSError as exc:
        log(f"ERROR: [Errno {exc.errno}] could not bind {args.host}:{args.port}: {exc.strerror} "
            "(address already in use?)", flush=True)
        await runner.cleanup()
        return 1
    if args.pid_file:
        with open(args.pid_file, "w") as fh:
            fh.write(str(os.getpid()))
    log(f"test server: listening on {args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log("test server: shutting down", flush=True)
        server._abort_all("server shutting down")
        server.resume.set()
        await runner.cleanup()
        await backend.close()
        for s in held:
            s.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workers = max(1, args.reuse_port_workers)
    if workers == 1:
        return asyncio.run(serve(args))
    children = []
    for _ in range(workers - 1):  # benchmark mode: more processes accept on the same port
        pid = os.fork()
        if pid == 0:
            args.nccl_port = None
            args.pid_file = None
            os._exit(asyncio.run(serve(args)))
        children.append(pid)
    try:
        return asyncio.run(serve(args))
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


if __name__ == "__main__":
    sys.exit(main())
