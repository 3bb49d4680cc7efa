"""The ``vllm`` engine: a client of vLLM servers (given by URL, or launched by this worker).

What every server engine shares (connections, retries, routing, launching,
readiness, weight versions per token, partial rollouts across an update) is
:class:`scaffold_remote.engine.RemoteEngine`; this class adds what is
vLLM's: the token-in/token-out protocols (:mod:`.protocol`), ``/v1/models``,
the pause endpoints (``POST /pause?mode=abort|keep|wait``, ``/resume``) and
the weight endpoints (``/collective_rpc`` into :mod:`.worker_extension`, or
the weight-transfer API: ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``).
vLLM reports no weight version: the engine's own bookkeeping says which
version sampled each token. Nothing heavy is imported here.
"""

from __future__ import annotations

import logging
import os
from typing import Annotated, Any, Literal

from scaffold_remote.client import error_message
from scaffold_remote.engine import (
    ConnectTimeout,
    MaxConnections,
    MaxRetries,
    PauseMode,
    RemoteEngine,
    RequestTimeout,
    RetryBackoff,
    SetupTimeout,
    UrlWaitTimeout,
)

from scaffold_core.errors import ConfigError, EngineError
from scaffold_core.plugins import Help
from scaffold_core.sampling import CONSTRAINT_KINDS

from .launcher import VLLMLaunchOptions, VLLMServer, flag_value

log = logging.getLogger("scaffold.vllm")

DEFAULT_API_KEY_ENV = "VLLM_API_KEY"  # vllm serve reads its --api-key from the same variable
DEFAULT_URL = "http://127.0.0.1:8000"
DEV_MODE_HINT = ("; vLLM serves its pause and weight endpoints only with VLLM_SERVER_DEV_MODE=1 in the server's "
                 "environment (engine.launch sets it)")
RPC_HINT = ("; start the servers with --worker-extension-cls scaffold_vllm.worker_extension.WeightLoader and "
            "VLLM_SERVER_DEV_MODE=1 (engine.launch does both), or use weight_sync: transfer")


class VLLMEngine(RemoteEngine):
    """Generates with vLLM servers, token ids in and token ids with logprobs out.

    Give ``url`` (one URL, a list, or comma-separated; default vLLM's own
    default address, ``http://127.0.0.1:8000``) to use running servers, or
    ``launch`` to start ``launch.count`` servers on this worker's ports.
    Requests go to ``/inference/v1/generate`` (``api: auto`` falls back to
    ``/v1/completions`` with token ids on servers without it), balanced by
    least in-flight requests, one episode per server. See the plugin README
    for every option.
    """

    server_name = "vllm"
    #: Every constraint kind: a request's ``sampling.constraint`` goes out as vLLM's ``structured_outputs``.
    constraints = frozenset(CONSTRAINT_KINDS)
    default_url = DEFAULT_URL
    default_api_key_env = DEFAULT_API_KEY_ENV
    launch_options = VLLMLaunchOptions

    def __init__(
        self,
        url: str | list[str] | None = None,
        launch: dict[str, Any] | None = None,
        tokenizer: str | None = None,
        trust_remote_code: bool = False,
        api_key_env: str | None = None,
        request_timeout: RequestTimeout = 600.0,
        connect_timeout: ConnectTimeout = 10.0,
        max_retries: MaxRetries = 4,
        retry_backoff: RetryBackoff = 0.5,
        max_connections: MaxConnections = 1024,
        setup_timeout: SetupTimeout = 1200.0,
        url_wait_timeout: UrlWaitTimeout = 60.0,
        health_path: str = "/health",
        sticky_episodes: bool = True,
        pause_mode: PauseMode = "abort",
        api: Literal["auto", "generate", "completions"] = "auto",
        weight_sync: Annotated[Literal["rpc", "transfer"], Help("rpc: the worker extension loads a checkpoint "
                                                                "directory; transfer: vLLM's weight-transfer API")]
        = "rpc",
        sampling_extra: dict[str, Any] | None = None,
    ):
        from .protocol import check_extra_sampling

        super().__init__(url=url, launch=launch, tokenizer=tokenizer, trust_remote_code=trust_remote_code,
                         api_key_env=api_key_env, request_timeout=request_timeout, connect_timeout=connect_timeout,
                         max_retries=max_retries, retry_backoff=retry_backoff, max_connections=max_connections,
                         setup_timeout=setup_timeout, url_wait_timeout=url_wait_timeout, health_path=health_path,
                         sticky_episodes=sticky_episodes, pause_mode=pause_mode)
        self.api = api
        self.weight_sync = weight_sync
        self.sampling_extra = check_extra_sampling(sampling_extra) if api != "completions" else \
            self._completions_extra(sampling_extra)
        self.served_model: str | None = None
        self.models: list[dict[str, Any]] = []
        self.server_version: str | None = None

    # -- the protocol -------------------------------------------------------------
    @staticmethod
    def _completions_extra(extra: dict[str, Any] | None) -> dict[str, Any]:
        from .protocol import COMPLETIONS_EXTRA, COMPLETIONS_PATH, check_extra_sampling

        return check_extra_sampling(extra, COMPLETIONS_EXTRA, COMPLETIONS_PATH)

    def protocol(self) -> Any:
        from .protocol import CompletionsProtocol, GenerateProtocol

        if self.api == "completions":
            return CompletionsProtocol(self.served_model, self.sampling_extra)
        return GenerateProtocol(self.sampling_extra)

    def server_spec(self) -> Any:
        return VLLMServer(worker_extension=self.weight_sync == "rpc",
                          weight_transfer="disk" if self.weight_sync == "transfer" else None)

    def launch_tokenizer(self) -> str:
        assert self.launch is not None
        return flag_value(self.launch.extra_args, "--tokenizer") or self.launch.model_path

    async def read_servers(self, client: Any) -> str | None:
        from .protocol import GENERATE_PATH, CompletionsProtocol

        lengths = []
        for server in client.pool.servers:
            listing = await client.get_json(server, "/v1/models", timeout=30.0)
            data = listing.get("data") if isinstance(listing, dict) else None
            if not data or not isinstance(data[0], dict):
                raise EngineError(f"{server.url}/v1/models lists no model: {listing!r:.200}", retryable=False)
            if server is client.pool.servers[0]:
                self.models = data
                self.served_model = str(data[0].get("id"))
            if isinstance(data[0].get("max_model_len"), int):
                lengths.append(data[0]["max_model_len"])
        self.context_length = min(lengths) if lengths else None
        first = client.pool.servers[0]
        try:
            version = await client.get_json(first, "/version", timeout=30.0)
            self.server_version = version.get("version") if isinstance(version, dict) else None
        except EngineError as exc:  # informational only
            log.debug("no /version from %s: %s", first.url, exc)
        if self.api == "auto":
            try:
                spec = await client.get_json(first, "/openapi.json", timeout=30.0)
            except EngineError:  # docs disabled (--disable-fastapi-docs): assume the generate endpoint
                spec = None
            paths = spec.get("paths") if isinstance(spec, dict) else None
            if isinstance(paths, dict) and GENERATE_PATH not in paths:
                log.warning("%s has no %s: generating through /v1/completions with token ids", first.url,
                            GENERATE_PATH)
                try:
                    self.sampling_extra = self._completions_extra(self.sampling_extra)
                except ValueError as exc:
                    raise ConfigError(f"engine.sampling_extra: {exc}") from None
                client.set_protocol(CompletionsProtocol(self.served_model, self.sampling_extra))
        elif self.api == "completions":
            client.set_protocol(CompletionsProtocol(self.served_model, self.sampling_extra))
        return str(self.models[0].get("root") or self.served_model)  # the model path, else the served name

    @property
    def endpoint(self) -> str:
        """The path requests go to (``/inference/v1/generate`` or ``/v1/completions``)."""
        client = self._client
        return client.protocol.generate_path if client is not None else self.protocol().generate_path

    # -- pauses -------------------------------------------------------------------------
    async def pause_servers(self, mode: str) -> None:
        await self.need_client().call_all("POST", f"/pause?mode={mode}", None, timeout=self.setup_timeout,
                                          hint=DEV_MODE_HINT)

    async def resume_servers(self) -> None:
        await self.need_client().call_all("POST", "/resume", None, timeout=self.setup_timeout, hint=DEV_MODE_HINT)

    # -- weights ------------------------------------------------------------------------
    def check_weights_source(self, source: Any) -> None:
        chunks = source if isinstance(source, list) else [source]
        if isinstance(source, (str, os.PathLike)) or (chunks and all(isinstance(c, dict) for c in chunks)):
            return
        raise EngineError("the vllm engine loads new weights from a checkpoint directory every server can read "
                          "(update_weights('/path/to/checkpoint')), or takes a weight-transfer update_info dict "
                          f"(or a list of them, one per chunk); got {type(source).__name__}", retryable=False)

    async def load_weights(self, source: Any, version: int) -> None:
        """``source``: a checkpoint directory (a ``save_pretrained`` folder of safetensors that every server can
        read at the same path), loaded by the worker extension (``weight_sync: rpc``) or the weight-transfer
        API's disk backend (``transfer``); or weight-transfer ``update_info`` dicts (NCCL or IPC: the trainer
        sends the tensors meanwhile)."""
        if isinstance(source, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(source))
            if self.weight_sync == "rpc":
                await self.need_client().call_all(
                    "POST", "/collective_rpc", {"method": "scaffold_load_weights", "args": [path]},
                    timeout=self.setup_timeout, hint=RPC_HINT)
            else:
                await self.transfer_weights([{"path": path}])
        else:
            await self.transfer_weights(source if isinstance(source, list) else [source])
        if self.paused_mode == "keep":  # requests kept across the update hold their blocks: best effort
            try:
                await self.need_client().call_all("POST", "/reset_prefix_cache", None, timeout=60.0)
            except EngineError as exc:
                log.debug("prefix cache not reset after the update: %s", exc)

    async def init_weight_transfer(self, init_info: dict[str, Any], timeout: float | None = None) -> None:
        """``POST /init_weight_transfer_engine`` on every server (NCCL: concurrently with the trainer's own
        rendezvous; the disk backend needs ``{}``)."""
        await self.need_client().call_all("POST", "/init_weight_transfer_engine", {"init_info": dict(init_info)},
                                          timeout=timeout or self.setup_timeout, hint=DEV_MODE_HINT)

    async def transfer_weights(self, chunks: list[dict[str, Any]]) -> None:
        """One weight update through the weight-transfer API: start, one ``/update_weights`` per chunk, finish
        (servers older than the start/finish phases answer 404 to them, which is fine)."""
        client = self.need_client()
        await self._optional_phase("/start_weight_update")
        for chunk in chunks:
            await client.call_all("POST", "/update_weights", {"update_info": chunk}, timeout=self.setup_timeout,
                                  hint=DEV_MODE_HINT + "; and with --weight-transfer-config naming a backend")
        await self._optional_phase("/finish_weight_update")

    async def _optional_phase(self, path: str) -> None:
        client = self.need_client()
        failures = []
        for server in client.pool.servers:
            status, body = await client.call(server, "POST", path, {}, timeout=self.setup_timeout)
            if status not in (200, 404):
                failures.append(f"{server.url}{path}: {error_message(status, body)}")
        if failures:
            raise EngineError("; ".join(failures), retryable=False)
