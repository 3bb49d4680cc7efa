"""The ``sglang`` engine: a client of SGLang servers (given by URL, or launched by this worker).

What every server engine shares (connections, retries, routing, launching,
readiness, weight versions, partial rollouts across an update) is
:class:`scaffold_remote.engine.RemoteEngine`; this class adds what is
SGLang's: the native ``/generate`` protocol, ``/model_info`` and
``/server_info``, ``/pause_generation`` and ``/continue_generation``, and
``/update_weights_from_disk``. Nothing heavy is imported here.
"""

from __future__ import annotations

import logging
import os
from typing import Any

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

from scaffold_core.errors import EngineError
from scaffold_core.sampling import CONSTRAINT_KINDS

from .launcher import SGLangLaunchOptions, SGLangServer, tokenizer_flag

log = logging.getLogger("scaffold.sglang")

DEFAULT_API_KEY_ENV = "SGLANG_API_KEY"
DEFAULT_URL = "http://127.0.0.1:30000"
#: SGLang's own pause modes, and scaffold's names for them.
SGLANG_PAUSE_MODES = {"abort": "abort", "keep": "retract", "retract": "retract", "in_place": "in_place"}


class SGLangEngine(RemoteEngine):
    """Generates with SGLang servers through their native ``/generate`` API (token ids and logprobs).

    Give ``url`` (one URL, a list, or comma-separated; default SGLang's own
    default address, ``http://127.0.0.1:30000``) to use running servers, or
    ``launch`` to start ``launch.count`` servers on this worker's ports. Requests are balanced by least
    in-flight requests; an episode sticks to one server. See the plugin README for every option.
    A request's ``sampling.constraint`` goes to SGLang as its native grammar parameter (``protocol.py``).
    """

    server_name = "sglang"
    default_url = DEFAULT_URL
    default_api_key_env = DEFAULT_API_KEY_ENV
    launch_options = SGLangLaunchOptions
    #: SGLang's own names are accepted by pause_generation too (``keep`` is ``retract``).
    extra_pause_modes = ("retract", "in_place")
    constraints = frozenset(CONSTRAINT_KINDS)

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
        health_path: str = "/health_generate",
        sticky_episodes: bool = True,
        pause_mode: PauseMode = "abort",
        send_sampling_seed: bool = False,
        sampling_extra: dict[str, Any] | None = None,
    ):
        from .protocol import check_extra_sampling

        super().__init__(url=url, launch=launch, tokenizer=tokenizer, trust_remote_code=trust_remote_code,
                         api_key_env=api_key_env, request_timeout=request_timeout, connect_timeout=connect_timeout,
                         max_retries=max_retries, retry_backoff=retry_backoff, max_connections=max_connections,
                         setup_timeout=setup_timeout, url_wait_timeout=url_wait_timeout, health_path=health_path,
                         sticky_episodes=sticky_episodes, pause_mode=pause_mode)
        self.send_sampling_seed = send_sampling_seed
        self.sampling_extra = check_extra_sampling(sampling_extra)
        self.model_info: dict[str, Any] = {}
        self.server_info: dict[str, Any] = {}

    # -- the protocol -------------------------------------------------------------
    def protocol(self) -> Any:
        from .protocol import SGLangProtocol

        return SGLangProtocol(send_seed=self.send_sampling_seed, extra_sampling=self.sampling_extra)

    def server_spec(self) -> Any:
        return SGLangServer()

    def launch_tokenizer(self) -> str:
        assert self.launch is not None
        return tokenizer_flag(self.launch.extra_args) or self.launch.model_path  # --tokenizer-path wins

    async def read_servers(self, client: Any) -> str | None:
        first = client.pool.servers[0]
        self.model_info = await client.get_json(first, "/model_info", timeout=30.0) or {}
        lengths = []
        for server in client.pool.servers:
            try:
                info = await client.get_json(server, "/server_info", timeout=30.0)
            except EngineError as exc:  # informational only
                log.debug("no /server_info from %s: %s", server.url, exc)
                continue
            if isinstance(info, dict):
                if server is first:
                    self.server_info = info
                if isinstance(info.get("context_length"), int):
                    lengths.append(info["context_length"])
        self.context_length = min(lengths) if lengths else None
        name = self.model_info.get("tokenizer_path") or self.model_info.get("model_path")
        return str(name) if name else None

    # -- weights and pauses -----------------------------------------------------
    async def update_weights_from_disk(self, model_path: str, *, weight_version: str | int | None = None,
                                       abort_all_requests: bool = False, flush_cache: bool = True,
                                       timeout: float | None = None) -> list[dict[str, Any]]:
        """Load new weights from ``model_path`` on every server (``POST /update_weights_from_disk``).

        Unless generation is paused (or ``abort_all_requests``), each server
        waits for its running requests to finish first. ``weight_version``
        labels the new policy; responses then carry it. Raises EngineError
        naming each server that failed. (The engine contract's
        :meth:`update_weights` calls this, between a pause and a resume.)
        """
        payload: dict[str, Any] = {"model_path": str(model_path), "abort_all_requests": bool(abort_all_requests),
                                   "flush_cache": bool(flush_cache)}
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        return await self.need_client().call_all("POST", "/update_weights_from_disk", payload,
                                                 timeout=timeout or self.setup_timeout, expect_success=True)

    def check_weights_source(self, source: Any) -> None:
        if not isinstance(source, (str, os.PathLike)):
            raise EngineError("the sglang engine loads new weights from a checkpoint directory the servers can "
                              f"read: update_weights('/path/to/checkpoint'); got {type(source).__name__}",
                              retryable=False)

    async def load_weights(self, source: Any, version: int) -> None:
        """``source`` is a checkpoint directory every server can read (a ``save_pretrained`` folder), loaded with
        :meth:`update_weights_from_disk` and labelled ``version``, which the servers then report. The prefix cache
        is flushed unless requests are kept on the servers across the update (``pause_mode: keep``)."""
        await self.update_weights_from_disk(os.fspath(source), weight_version=version,
                                            flush_cache=self.pause_mode != "keep")

    async def pause_servers(self, mode: str) -> None:
        if mode == "wait":  # no pause: /update_weights_from_disk waits for the running requests itself
            return
        await self.need_client().call_all("POST", "/pause_generation", {"mode": SGLANG_PAUSE_MODES[mode]})

    async def resume_servers(self) -> None:
        if self.paused_mode != "wait":
            await self.need_client().call_all("POST", "/continue_generation", {})

    async def flush_cache(self) -> None:
        """Flush every server's prefix cache (servers refuse while requests run: pause first)."""
        await self.need_client().call_all("POST", "/flush_cache")

    async def abort_all(self) -> None:
        """Abort every request on every server (they come back as ``abort`` and are retried by the runtime)."""
        await self.need_client().call_all("POST", "/abort_request", {"abort_all": True})
