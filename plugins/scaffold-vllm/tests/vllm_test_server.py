"""A protocol test server for vLLM's token-in/token-out HTTP API (tests and benchmarks only; no GPU, no vllm).

Written from vLLM's own request and response models and route handlers
(``GenerateRequest``/``GenerateResponse`` of the tokens endpoint,
``CompletionRequest``/``CompletionResponse``, ``SamplingParams``, the
development routes for pausing and weight transfer). It implements:

* ``POST /inference/v1/generate``: ``token_ids`` (at least one, none
  negative), ``sampling_params`` as vLLM's ``SamplingParams``: a key it does
  not know is dropped without a word, as vLLM's msgspec struct does (the
  dropped keys are recorded in ``ignored_fields`` so tests can see that
  nothing was dropped); ``max_tokens`` defaults to 16 when absent, as in
  vLLM. The answer: ``choices[0]`` with ``token_ids``, ``finish_reason`` and
  ``logprobs.content`` (``"token": "token_id:<id>"``, or with
  ``--logprobs-format ids`` the newer ``"token_id": <id>``), the sampled
  token first among the top entries, ``-9999.0`` for a logprob it lacks.
* ``POST /v1/completions`` with a token-id ``prompt``: ``logprobs`` in the
  completions shape, whose ``tokens`` are decoded text unless the request
  sets ``return_tokens_as_token_ids`` or the server runs with
  ``--return-tokens-as-token-ids``; ``token_ids`` only when the request
  sets ``return_token_ids`` (``--no-return-token-ids`` imitates servers
  older than that field).
* ``GET /health``, ``/ping``, ``/version``, ``/v1/models``, ``/openapi.json``
  (``--no-generate-endpoint`` leaves out the tokens endpoint).
* With ``VLLM_SERVER_DEV_MODE=1`` (as vLLM, read from the environment at
  start, or ``dev_mode=True`` in process): ``POST /pause?mode=abort|wait|keep``
  (in-flight requests end aborted with their partial output, finish first,
  or freeze until ``POST /resume``; new requests wait), ``GET /is_paused``,
  the weight-transfer API (``/init_weight_transfer_engine``,
  ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``;
  ``--weight-transfer-config '{"backend": "disk"}'`` loads
  ``update_info.path``), ``/collective_rpc`` (``scaffold_load_weights`` when
  started with ``--worker-extension-cls`` naming scaffold's loader),
  ``/reset_prefix_cache``.
* ``--api-key`` (or ``VLLM_API_KEY``): ``Authorization: Bearer`` on every
  path but ``/health``; errors as vLLM's ``ErrorResponse``
  (``{"error": {"message", "type", "param", "code"}}``).

Each token is sampled under the server's current weights label (the path of
the checkpoint loaded last): ``responses[i]["labels"]`` is the ground truth
a client's per-token versions are checked against. Run it like ``vllm serve``
(``python vllm_test_server.py [serve] MODEL --port 8000``); the test-only flags
of :mod:`scaffold_testkit.remote_server` simulate slow starts, servers
that never become ready, crashes, per-token latency, 5xx answers and dropped
connections.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
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

VERSION = "0.29.0+scaffold-test-server"
#: vLLM's ``SamplingParams`` fields (a key outside them is dropped by msgspec without a word).
SAMPLING_FIELDS = frozenset({
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k", "min_p",
    "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
    "prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids", "flat_logprobs", "detokenize",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output", "output_kind",
    "stream_interval", "skip_clone", "structured_outputs", "logit_bias", "allowed_token_ids", "extra_args",
    "bad_words", "skip_reading_prefix_cache", "thinking_token_budget", "repetition_detection",
    "routed_experts_prompt_start", "trace_decode_token_ids", "truncate_prompt_tokens",
})
#: ``GenerateRequest`` fields besides ``sampling_params`` (extra keys are allowed and ignored).
GENERATE_FIELDS = frozenset({"request_id", "token_ids", "features", "sampling_params", "model", "stream",
                             "stream_options", "cache_salt", "priority", "kv_transfer_params"})
COMPLETION_FIELDS = frozenset({
    "model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty",
    "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user", "use_beam_search", "top_k",
    "min_p", "repetition_penalty", "length_penalty", "stop_token_ids", "include_stop_str_in_output", "ignore_eos",
    "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "allowed_token_ids", "prompt_logprobs", "prompt_embeds", "add_special_tokens", "response_format",
    "structured_outputs", "priority", "request_id", "logits_processors", "return_tokens_as_token_ids",
    "return_token_ids", "cache_salt", "kv_transfer_params", "vllm_xargs",
})
DEV_PATHS = ("/pause", "/resume", "/is_paused", "/init_weight_transfer_engine", "/start_weight_update",
             "/update_weights", "/finish_weight_update", "/collective_rpc", "/reset_prefix_cache",
             "/get_world_size")
LOADER_METHOD = "scaffold_load_weights"
PAUSE_MODES = ("abort", "wait", "keep")


class BadRequest(Exception):
    """Becomes vLLM's ``ErrorResponse``."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param


def error_response(message: str, status: int = 400, param: str | None = None) -> web.Response:
    kind = {400: "BadRequestError", 401: "Unauthorized", 404: "NotFoundError"}.get(status, "InternalServerError")
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                             status=status)


class TestServer(FakeServer):
    """State and handlers of one vLLM test server (usable in-process or as a subprocess)."""

    def __init__(self, *, served_model_name: str | None = None, dev_mode: bool = False,
                 generate_endpoint: bool = True, logprobs_format: str = "tokens", return_token_ids: bool = True,
                 tokens_as_ids: bool = False, weight_transfer: str | None = None, worker_extension: bool = True,
                 tp_size: int = 1, backend: Any = None, **common: Any):
        super().__init__(backend=backend or RandomBackend(), **common)
        self.served_model_name = served_model_name or self.model_path
        self.dev_mode = dev_mode
        self.generate_endpoint = generate_endpoint
        self.logprobs_format = logprobs_format
        self.return_token_ids = return_token_ids
        self.tokens_as_ids = tokens_as_ids
        self.weight_transfer = weight_transfer
        self.worker_extension = worker_extension
        self.tp_size = tp_size
        self.transfer_ready = False
        self.updating = False
        self.ignored_fields: list[str] = []
        self.bodies: list[dict[str, Any]] = []  # every generation body received, as sent

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 1024 * 1024)
        r = app.router
        if self.generate_endpoint:
            r.add_post("/inference/v1/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/health", self.health)
        r.add_route("*", "/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/v1/models", self.models)
        r.add_get("/openapi.json", self.openapi)
        if self.dev_mode:
            r.add_post("/pause", self.pause_route)
            r.add_post("/resume", self.resume_route)
            r.add_get("/is_paused", self.is_paused)
            r.add_post("/init_weight_transfer_engine", self.init_transfer)
            r.add_post("/start_weight_update", self.start_update)
            r.add_post("/update_weights", self.update_weights)
            r.add_post("/finish_weight_update", self.finish_update)
            r.add_post("/collective_rpc", self.collective_rpc)
            r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not self.authorized(request.path, request.headers.get("Authorization")):
            return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request)
        except BadRequest as exc:
            return error_response(str(exc), exc.status, exc.param)

    async def _json(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise BadRequest(f"JSON decode error: {exc}") from None

    # -- generation -----------------------------------------------------------
    def _sampling(self, params: dict[str, Any], prompt: list[int]) -> tuple[Sampling, int | None]:
        """vLLM's validation of the fields the backend honours; (sampling, logprobs asked)."""
        def number(key: str, default: Any, kind: type) -> Any:
            value = params.get(key, default)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
                raise BadRequest(f"{key} must be a {kind.__name__}, got {value!r}.", param=key)
            return value

        max_tokens = number("max_tokens", 16, int)  # vLLM's default: 16 tokens
        temperature = number("temperature", 1.0, float)
        top_p = number("top_p", 1.0, float)
        top_k = number("top_k", 0, int)
        seed = params.get("seed")
        logprobs = params.get("logprobs")
        if max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        if temperature < 0:
            raise BadRequest(f"temperature must be non-negative, got {temperature}.", param="temperature")
        if not 0 < top_p <= 1:
            raise BadRequest(f"top_p must be in (0, 1], got {top_p}.", param="top_p")
        if top_k < -1:
            raise BadRequest(f"top_k must be 0 (disable), or at least 1, got {top_k}.", param="top_k")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**63):
            raise BadRequest(f"seed must be a 64-bit integer, got {seed!r}.", param="seed")
        if logprobs is not None and (not isinstance(logprobs, int) or logprobs < -1):
            raise BadRequest(f"logprobs must be non-negative or -1, got {logprobs}.", param="logprobs")
        if params.get("n", 1) != 1:
            raise BadRequest("the test server generates n=1 only", param="n")
        total = len(prompt) + max_tokens
        if total > self.context_length:
            raise BadRequest(f"This model's maximum context length is {self.context_length} tokens. However, you "
                             f"requested {total} tokens ({len(prompt)} in the messages, {max_tokens} in the "
                             "completion). Please reduce the length of the messages or completion.")
        stop = params.get("stop") or []
        stop_ids = params.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                     for t in stop_ids):
            raise BadRequest("stop_token_ids must be a list of integers", param="stop_token_ids")
        sampling = Sampling(max_tokens=max_tokens, temperature=float(temperature), seed=seed,
                            stop=[stop] if isinstance(stop, str) else list(stop), stop_token_ids=list(stop_ids),
                            ignore_eos=bool(params.get("ignore_eos")), top_logprobs=max(0, logprobs or 0),
                            top_p=float(top_p), top_k=top_k if top_k > 0 else -1)
        return sampling, logprobs

    @staticmethod
    def _prompt(ids: Any, field: str) -> list[int]:
        if not isinstance(ids, list) or not ids:
            raise BadRequest(f"{field}: List should have at least 1 item after validation, not 0", param=field)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise BadRequest(f"{field}: Input should be a valid list of integers", param=field)
        if any(t < 0 for t in ids):
            raise BadRequest("token_ids must not contain negative values", param=field)
        return ids

    async def _injected(self, request: web.Request) -> web.Response | None:
        injected = self.injected()
        if injected == "drop":  # the connection breaks after the request was read, before any answer
            request.transport.abort()  # type: ignore[union-attr]
            return web.Response(status=500)
        if injected == "fail":
            return error_response("injected failure", self.fail_status)
        return None

    async def generate(self, request: web.Request) -> web.Response:
        self.requests_seen += 1
        body = await self._json(request)
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        self.bodies.append(body)
        refused = await self._injected(request)
        if refused is not None:
            return refused
        prompt = self._prompt(body.get("token_ids"), "token_ids")
        params = body.get("sampling_params")
        if not isinstance(params, dict):
            raise BadRequest("sampling_params: Field required", param="sampling_params")
        self.ignored_fields += [k for k in params if k not in SAMPLING_FIELDS]
        sampling, logprobs = self._sampling(params, prompt)
        rid = str(body.get("request_id") or uuid.uuid4().hex)
        out, _ = await self.run_one(rid, prompt, sampling)
        content = None
        if logprobs is not None:
            content = [self._content(token, lp, out.tops[i] if out.tops else [], logprobs)
                       for i, (token, lp) in enumerate(zip(out.ids, out.logprobs))]
        choice = {"index": 0, "logprobs": None if content is None else {"content": content},
                  "finish_reason": out.finish, "token_ids": out.ids, "routed_experts": None}
        return web.json_response({
            "request_id": f"generate-tokens-{rid}", "model": self.served_model_name, "created": int(time.time()),
            "choices": [choice], "usage": self._usage(prompt, out), "prompt_logprobs": None,
            "kv_transfer_params": None})

    def _content(self, token: int, logprob: float, tops: list[tuple[int, float]], asked: int) -> dict[str, Any]:
        entries = [(token, logprob), *[(t, lp) for t, lp in tops if t != token]][:max(asked, 1)]
        if self.logprobs_format == "ids":
            return {"token_id": token, "logprob": logprob,
                    "top_logprobs": [{"token_id": t, "logprob": lp} for t, lp in entries]}
        return {"token": f"token_id:{token}", "logprob": logprob, "bytes": None,
                "top_logprobs": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None} for t, lp in entries]}

    @staticmethod
    def _usage(prompt: list[int], out: Generated) -> dict[str, Any]:
        return {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(out.ids),
                "completion_tokens": len(out.ids), "prompt_tokens_details": None}

    def _token_text(self, token: int, as_id: bool) -> str:
        if as_id or self.tokens_as_ids or self.decode is None:
            return f"token_id:{token}"
        return self.decode([token])

    async def completions(self, request: web.Request) -> web.Response:
        self.requests_seen += 1
        body = await self._json(request)
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        self.bodies.append(body)
        refused = await self._injected(request)
        if refused is not None:
            return refused
        model = body.get("model")
        if model is not None and model != self.served_model_name:
            raise BadRequest(f"The model `{model}` does not exist.", status=404, param="model")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = self.backend.encode_text(prompt)
        batch = isinstance(prompt, list) and bool(prompt) and all(isinstance(p, list) for p in prompt)
        prompts = [self._prompt(p, "prompt") for p in prompt] if batch else [self._prompt(prompt, "prompt")]
        known = COMPLETION_FIELDS if self.return_token_ids else COMPLETION_FIELDS - {"return_token_ids"}
        self.ignored_fields += [k for k in body if k not in known]
        asked_prompt = body.get("prompt_logprobs")
        if asked_prompt is not None and (not isinstance(asked_prompt, int) or asked_prompt < -1):
            raise BadRequest(f"prompt_logprobs must be non-negative or -1, got {asked_prompt}.",
                             param="prompt_logprobs")
        echo = bool(body.get("echo"))
        rid0 = str(body.get("request_id") or uuid.uuid4().hex)
        choices, usages = [], []
        for index, one in enumerate(prompts):
            sampling, logprobs = self._sampling(body, one)
            out, _ = await self.run_one(f"{rid0}-{index}" if batch else rid0, one, sampling)
            choices.append(self._completion_choice(index, one, out, body, logprobs, asked_prompt, echo))
            usages.append(self._usage(one, out))
        usage = usages[0] if len(usages) == 1 else {
            key: sum(u[key] for u in usages) for key in ("prompt_tokens", "total_tokens", "completion_tokens")}
        return web.json_response({"id": f"cmpl-{rid0}", "object": "text_completion", "created": int(time.time()),
                                  "model": self.served_model_name, "choices": choices,
                                  "usage": usage, "kv_transfer_params": None})

    def _completion_choice(self, index: int, prompt: list[int], out: Generated, body: dict[str, Any],
                           logprobs: int | None, asked_prompt: int | None, echo: bool) -> dict[str, Any]:
        as_id = bool(body.get("return_tokens_as_token_ids"))
        eos = out.finish == "stop" and out.matched == self.backend.eos_token_id
        scored = None
        if asked_prompt is not None or (echo and logprobs is not None):
            scored = self.backend.prompt_logprobs(prompt, max(asked_prompt or 0, logprobs or 0))
        choice: dict[str, Any] = {"index": index, "text": out.text or "", "logprobs": None,
                                  "finish_reason": out.finish,
                                  "stop_reason": None if out.finish != "stop" or eos else out.matched,
                                  "prompt_logprobs": None}
        if asked_prompt is not None and scored is not None:  # vLLM: the prompt token itself, then the top k
            k = asked_prompt if asked_prompt >= 0 else 20
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": lp, "rank": rank, "decoded_token": self._token_text(t, as_id)}
                 for rank, (t, lp) in enumerate(sorted([(token, entry[0]), *entry[1][:k]], key=lambda e: -e[1]),
                                                start=1)}
                for token, entry in zip(prompt[1:], scored[1:]) if entry is not None]
        if logprobs is not None:
            tops = out.tops or [[] for _ in out.ids]
            ids, values = list(out.ids), list(out.logprobs)
            width = max(logprobs, 1)
            top_lists: list[Any] = [{self._token_text(t, as_id): lp for t, lp in [(token, lp0), *alts][:width]}
                                    for token, lp0, alts in zip(out.ids, out.logprobs, tops)]
            if echo and scored is not None:  # the prompt's tokens first, the first without a logprob
                ids = list(prompt) + ids
                values = [None if e is None else e[0] for e in scored] + values
                top_lists = [None if e is None else
                             {self._token_text(t, as_id): lp for t, lp in [(token, e[0]), *e[1]][:width]}
                             for token, e in zip(prompt, scored)] + top_lists
            choice["logprobs"] = {"text_offset": list(range(len(ids))), "token_logprobs": values,
                                  "tokens": [self._token_text(t, as_id) for t in ids], "top_logprobs": top_lists}
        if self.return_token_ids and body.get("return_token_ids"):
            choice["token_ids"] = out.ids
            choice["prompt_token_ids"] = prompt
        return choice

    # -- health and info --------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.is_up else 503)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": self.model_path, "parent": None, "max_model_len": self.context_length, "permission": []}]})

    async def openapi(self, request: web.Request) -> web.Response:
        paths = {route.resource.canonical: {route.method.lower(): {}} for route in request.app.router.routes()
                 if route.resource is not None}
        return web.json_response({"openapi": "3.1.0", "info": {"title": "vLLM", "version": VERSION},
                                  "paths": paths})

    # -- pauses ---------------------------------------------------------------------
    async def pause_route(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        self.control_log.append(("pause", {"mode": mode, **dict(request.query)}))
        if mode not in PAUSE_MODES:
            return web.json_response({"detail": [{"loc": ["query", "mode"], "msg": "Input should be 'abort', "
                                                  "'wait' or 'keep'", "type": "literal_error"}]}, status=422)
        await self.pause(mode)
        return web.json_response({"status": "paused"})

    async def resume_route(self, request: web.Request) -> web.Response:
        self.control_log.append(("resume", {}))
        self.continue_all()
        return web.json_response({"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": not self.resume.is_set()})

    # -- weights --------------------------------------------------------------------
    def _load(self, path: Any) -> None:
        if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isdir(path):
            raise BadRequest(f"Shared-disk checkpoint path must be a local directory: {path}")
        if self.resume.is_set() and self.live:  # vLLM reloads between steps; scaffold pauses first
            self.control_log.append(("loaded while generating", {"path": path}))
        self.weights = path

    async def init_transfer(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self.control_log.append(("init_weight_transfer_engine", body))
        if body.get("init_info") is None:
            raise BadRequest("Missing 'init_info' in request body")
        if self.weight_transfer is None:
            raise BadRequest("Weight transfer is not configured: start the server with --weight-transfer-config",
                             status=500)
        self.transfer_ready = True
        return web.json_response({"message": "Weight transfer initialized"})

    async def start_update(self, request: web.Request) -> web.Response:
        self.control_log.append(("start_weight_update", await self._json(request)))
        if self.updating:
            raise BadRequest("A weight update is already active", status=500)
        self.updating = True
        return web.json_response({"message": "Weight update started"})

    async def update_weights(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self.control_log.append(("update_weights", body))
        info = body.get("update_info")
        if info is None:
            raise BadRequest("Missing 'update_info' in request body")
        if self.weight_transfer is None:
            raise BadRequest("Weight transfer is not configured: start the server with --weight-transfer-config",
                             status=500)
        if not self.updating:
            raise BadRequest("start_weight_update must be called before loading a checkpoint", status=500)
        if self.weight_transfer == "disk":
            self._load(info.get("path"))
        else:  # nccl / ipc: the trainer sends the tensors; the update names them
            self.weights = f"{self.weight_transfer}:{info.get('version', len(self.control_log))}"
        return web.json_response({"message": "Weights updated"})

    async def finish_update(self, request: web.Request) -> web.Response:
        self.control_log.append(("finish_weight_update", await self._json(request)))
        if not self.updating:
            raise BadRequest("No weight update is active", status=500)
        self.updating = False
        return web.json_response({"message": "Weight update finished"})

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self.control_log.append(("collective_rpc", body))
        method = body.get("method")
        if method is None:
            raise BadRequest("Missing 'method' in request body")
        if method != LOADER_METHOD or not self.worker_extension:
            raise BadRequest(f"'Worker' object has no attribute '{method}'", status=500)
        args = body.get("args") or []
        if len(args) != 1:
            raise BadRequest(f"{LOADER_METHOD}() takes 1 positional argument but {len(args)} were given", 500)
        self._load(args[0])
        return web.json_response({"results": [3] * self.tp_size})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.control_log.append(("reset_prefix_cache", {}))
        return web.Response(status=200)


# ---------------------------------------------------------------------------
# The command line (subprocess tests, benchmarks)
# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":  # `vllm serve MODEL ...`
        argv = argv[1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Flags spelled as in `vllm serve`.
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--tokenizer")
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--seed", dest="random_seed", type=int, default=0)
    p.add_argument("--return-tokens-as-token-ids", action="store_true")
    p.add_argument("--worker-extension-cls")
    p.add_argument("--weight-transfer-config")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--gpu-memory-utilization", type=float)
    # Test-only flags.
    p.add_argument("--no-generate-endpoint", action="store_true", help="serve no /inference/v1/generate")
    p.add_argument("--no-return-token-ids", action="store_true", help="ignore return_token_ids (older vLLM)")
    p.add_argument("--logprobs-format", choices=("tokens", "ids"), default="tokens")
    add_common_flags(p)
    args = p.parse_args(argv)
    args.model_path = args.model_tag or args.model or DEFAULT_MODEL
    if os.environ.get("VLLM_PORT"):
        args.hold_port.append(int(os.environ["VLLM_PORT"]))  # vLLM opens its own ports from there
    return args


def make_server(args: argparse.Namespace, backend: Any) -> TestServer:
    transfer = json.loads(args.weight_transfer_config).get("backend") if args.weight_transfer_config else None
    return TestServer(model_path=args.model_path, tokenizer_path=args.tokenizer, backend=backend,
                      api_key=args.api_key, served_model_name=args.served_model_name,
                      context_length=args.max_model_len, warmup_delay_s=args.warmup_delay,
                      never_ready=args.never_ready, fail_first=args.fail_first, fail_status=args.fail_status,
                      drop_first=args.drop_first, port=args.port,
                      dev_mode=os.environ.get("VLLM_SERVER_DEV_MODE") == "1",
                      generate_endpoint=not args.no_generate_endpoint, logprobs_format=args.logprobs_format,
                      return_token_ids=not args.no_return_token_ids, tokens_as_ids=args.return_tokens_as_token_ids,
                      weight_transfer=transfer,
                      worker_extension=args.worker_extension_cls == "scaffold_vllm.worker_extension.WeightLoader",
                      tp_size=args.tensor_parallel_size)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    banner = (f"test server: model {args.model_path}, backend {args.backend}, host {args.host}, port {args.port}, "
              f"VLLM_PORT {os.environ.get('VLLM_PORT')}, CUDA_VISIBLE_DEVICES "
              f"{os.environ.get('CUDA_VISIBLE_DEVICES')}, tp {args.tensor_parallel_size}, dev mode "
              f"{os.environ.get('VLLM_SERVER_DEV_MODE') == '1'}")
    return serve_main(args, make_server, banner)


if __name__ == "__main__":
    sys.exit(main())
