"""A protocol test server for SGLang's native HTTP API (tests and benchmarks only; no GPU, no sglang).

It implements the documented behaviour of ``/generate`` (input ids, sampling
params validated like sglang 0.5.23 or 0.5.8, logprob tuples, finish reasons,
``n``, batches, duplicate rids, context-length errors), ``/health``,
``/health_generate``, ``/ready``, ``/model_info``, ``/server_info``,
``/flush_cache``, ``/update_weights_from_disk``, ``/pause_generation``,
``/continue_generation``, ``/abort_request`` and API-key checks, with the
error bodies SGLang sends.

Tokens come from a *backend* (:mod:`scaffold_testkit.remote_server`,
shared with the other server engines' test servers, as are pausing, the
weights label of each token, injected failures and the CLI plumbing):

* ``random`` (default): deterministic pseudo-random tokens from an RNG seeded
  per request (greedy requests by the prompt alone, sampled ones by the
  ``sampling_seed`` or else the rid), fast enough for a client benchmark.
  With ``--tokenizer-path builtin:byte`` (scaffold's byte tokenizer; use
  ``--vocab-size 262``) responses carry ``text`` and stop strings end
  generation, as in SGLang; with any other tokenizer, or with
  ``--skip-tokenizer-init``, there is no ``text`` and stop strings are
  ignored (as SGLang with ``--skip-tokenizer-init``).
* ``transformers``: scaffold's embedded engine (a real model on CPU).

With ``--compat 0.5.23`` (the default) a response whose tokens two weight
versions sampled (a request kept across an update) carries
``meta_info.weight_versions`` spans, as SGLang 0.5.23 does. With
``--enable-metrics``, as SGLang then does, ``meta_info`` also carries the
request's timestamps, ``inference_time`` and ``decode_throughput``.

Run it exactly like ``python -m sglang.launch_server`` (same flag spelling for
the flags it knows), e.g.::

    python sglang_test_server.py --model-path HuggingFaceTB/SmolLM2-135M-Instruct --port 30000

Test-only flags simulate slow starts, servers that never become ready,
crashes, per-token latency and injected 5xx answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from aiohttp import web
from scaffold_testkit.remote_server import (
    DEFAULT_MODEL,
    FakeServer,
    Generated,
    RandomBackend,
    Sampling,
    add_common_flags,
    running,
)
from scaffold_testkit.remote_server import (
    main as serve_main,
)

__all__ = ["DEFAULT_MODEL", "RandomBackend", "TestServer", "running"]

SAMPLING_KEYS = (
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_new_tokens", "stop", "stop_token_ids", "stop_regex", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "logit_bias", "custom_params", "stream_interval", "sampling_seed",
)
FLOAT_KEYS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
INT_KEYS = ("max_new_tokens", "top_k", "min_new_tokens", "n", "sampling_seed", "stream_interval")
HEALTH_PATHS = ("/health", "/health_generate", "/ready")
#: SGLang's pause modes, as the shared server state knows them.
PAUSE_MODES = {"abort": "abort", "retract": "keep", "in_place": "keep"}


class BadRequest(Exception):
    """Becomes an HTTP error response with SGLang's body shape."""

    def __init__(self, status: int, body: Any):
        super().__init__(str(body))
        self.status = status
        self.body = body


def _message(text: str) -> dict[str, Any]:
    return {"error": {"message": text}}


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------


class TestServer(FakeServer):
    """State and handlers of one SGLang test server (usable in-process or as a subprocess)."""

    open_paths = HEALTH_PATHS

    def __init__(self, *, weight_version: str = "default", compat: str = "0.5.23", tp_size: int = 1,
                 skip_tokenizer_init: bool = False, enable_metrics: bool = False, backend: Any = None,
                 **common: Any):
        super().__init__(backend=backend or RandomBackend(), weights=weight_version, **common)
        self.enable_metrics = enable_metrics
        if skip_tokenizer_init:
            self.decode = None
        self.skip_tokenizer_init = skip_tokenizer_init
        self.compat = compat
        self.compat_v = tuple(int(x) for x in compat.split(".")[:3])
        self.tp_size = tp_size

    @property
    def weight_version(self) -> str:
        return self.weights

    @weight_version.setter
    def weight_version(self, value: str) -> None:
        self.weights = value

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
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not self.authorized(request.path, request.headers.get("Authorization")):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

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
            injected = self.injected()
            if injected == "drop":  # the connection breaks before any answer
                request.transport.abort()  # type: ignore[union-attr]
                return web.Response(status=500)
            if injected == "fail":
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
            starts = body.get("logprob_start_len")
            starts = starts if isinstance(starts, list) else [starts] * len(prompts)
            if len(starts) != len(prompts):
                raise BadRequest(400, _message("logprob_start_len list length must match the batch size."))
            jobs = []
            for i, (prompt, params) in enumerate(zip(prompts, params_list)):
                for j in range(n):
                    jobs.append(self._one(rids[i * n + j], prompt, params, want_logprob, started,
                                          body.get("top_logprobs_num", 0), starts[i]))
            outs = await asyncio.gather(*jobs) if len(jobs) > 1 else [await jobs[0]]
        except BadRequest as exc:
            if isinstance(exc.body, str):
                return web.Response(status=exc.status, text=exc.body)
            return web.json_response(exc.body, status=exc.status)
        payload = outs if (batch or n > 1) else outs[0]
        return web.Response(body=json.dumps(payload, separators=(",", ":")).encode(),
                            content_type="application/json")

    async def _one(self, rid: str, prompt: list[int], params: dict[str, Any], want_logprob: Any,
                   started: float, top_logprobs: Any = 0, start: Any = None) -> dict[str, Any]:
        stop = params.get("stop") or ()
        sampling = Sampling(max_tokens=params["max_new_tokens"], temperature=params["temperature"],
                            seed=params.get("sampling_seed"), stop=[stop] if isinstance(stop, str) else list(stop),
                            stop_token_ids=list(params.get("stop_token_ids") or ()),
                            ignore_eos=bool(params.get("ignore_eos")), top_p=params["top_p"], top_k=params["top_k"],
                            top_logprobs=int(top_logprobs or 0))
        forward = time.perf_counter()
        out, live = await self.run_one(rid, prompt, sampling)
        finished = time.perf_counter()
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": self._finish(out), "prompt_tokens": len(prompt),
            "completion_tokens": len(out.ids), "cached_tokens": 0, "weight_version": self.weights,
            "e2e_latency": finished - started,
        }
        if self.enable_metrics:  # SGLang --enable-metrics: its timestamps, the inference time, the decode rate
            n = len(out.ids)
            first_token = forward + (finished - forward) / max(1, n)  # the tokens come at an even pace here
            meta.update(request_received_ts=time.time() - (finished - started), request_finished_ts=time.time(),
                        inference_time=finished - forward)
            if n > 1 and finished > first_token:
                meta["decode_throughput"] = (n - 1) / (finished - first_token)
        if self.compat_v >= (0, 5, 23) and len(set(out.labels)) > 1:
            meta["weight_versions"] = spans(out.labels)
        meta["num_retractions" if self.compat_v >= (0, 5, 15) else "total_retractions"] = live.retractions
        if want_logprob:
            # SGLang: the input's tokens from logprob_start_len (default -1: the last one), the first of them
            # without a logprob (the logits before it are not computed); then their top alternatives if asked.
            first = len(prompt) - 1 if start is None or start < 0 else min(int(start), len(prompt) - 1)
            k = int(top_logprobs or 0)
            scored = self.backend.prompt_logprobs(prompt, k) if first < len(prompt) - 1 else []
            meta["input_token_logprobs"] = [[None, prompt[first], None]] + [
                [scored[j][0], prompt[j], None] for j in range(first + 1, len(prompt))]  # type: ignore[index]
            if k:
                meta["input_top_logprobs"] = [None] + [[[v, t, None] for t, v in scored[j][1]]  # type: ignore[index]
                                                       for j in range(first + 1, len(prompt))]
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(out.logprobs, out.ids)]
            if out.tops is not None:  # the k most likely: here the sampled token, then alternatives
                meta["output_top_logprobs"] = [
                    [[v, t, None] for t, v in [(token, lp), *[a for a in alts if a[0] != token]][:len(alts)]]
                    for token, lp, alts in zip(out.ids, out.logprobs, out.tops)]
        body: dict[str, Any] = {"output_ids": out.ids, "meta_info": meta}
        if out.text is not None and not self.skip_tokenizer_init:
            body = {"text": out.text, **body}
        self.responses[-1]["weight_version"] = self.weights
        return body

    @staticmethod
    def _finish(out: Generated) -> dict[str, Any]:
        if out.finish == "stop":
            return {"type": "stop", "matched": out.matched}
        if out.finish == "length":
            return {"type": "length", "length": len(out.ids)}
        if out.message == "Abort in waiting queue":
            return {"type": "abort", "message": out.message}
        return {"type": "abort", "message": out.message, "status_code": None, "err_type": None}

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
        return self.abort_all(message)

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
        if mode not in PAUSE_MODES:
            return web.json_response(_message(f"Invalid pause mode {mode!r}"), status=400)
        await self.pause(PAUSE_MODES[mode])
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self.control_log.append(("continue_generation", dict(body)))
        self.continue_all()
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


def spans(labels: list[str]) -> list[dict[str, Any]]:
    """Per-token weight labels as SGLang 0.5.23's ``weight_versions``: ``[{version, start, end}]``, end exclusive."""
    out: list[dict[str, Any]] = []
    for i, label in enumerate(labels):
        if out and out[-1]["version"] == label:
            out[-1]["end"] = i + 1
        else:
            out.append({"version": label, "start": i, "end": i + 1})
    return out


# ---------------------------------------------------------------------------
# The command line (subprocess tests, benchmarks)
# ---------------------------------------------------------------------------


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
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--log-level", default="info")
    # Test-only flags.
    p.add_argument("--compat", default="0.5.23", help="sglang version to imitate where versions differ")
    add_common_flags(p)
    args = p.parse_args(argv)
    if args.nccl_port is not None:
        args.hold_port.append(args.nccl_port)  # SGLang's torch.distributed store holds --nccl-port
    return args


def make_server(args: argparse.Namespace, backend: Any) -> TestServer:
    return TestServer(model_path=args.model_path, backend=backend, api_key=args.api_key,
                      weight_version=args.weight_version, context_length=args.context_length, compat=args.compat,
                      warmup_delay_s=0.0 if args.skip_server_warmup else args.warmup_delay,
                      never_ready=args.never_ready, fail_first=args.fail_first, fail_status=args.fail_status,
                      drop_first=args.drop_first, tokenizer_path=args.tokenizer_path, port=args.port,
                      tp_size=args.tp_size, skip_tokenizer_init=args.skip_tokenizer_init,
                      enable_metrics=args.enable_metrics)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    banner = (f"test server: model {args.model_path}, backend {args.backend}, host {args.host}, port {args.port}, "
              f"nccl port {args.nccl_port}, tp {args.tp_size}, base gpu {args.base_gpu_id}")
    return serve_main(args, make_server, banner)


if __name__ == "__main__":
    sys.exit(main())
