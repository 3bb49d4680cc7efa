"""The ``sglang`` engine: a client of SGLang servers (given by URL, or launched by this worker).

Nothing heavy is imported here: aiohttp, pydantic, transformers and the
launcher load inside ``__init__``/``start()`` only when needed, so ``scaffold
list-plugins`` stays fast.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Coroutine
from typing import Any

from scaffold_core.engine import Engine, RunInfo
from scaffold_core.errors import ConfigError, EngineError
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.sampling import CONSTRAINT_KINDS
from scaffold_core.tokenizers import response_text

log = logging.getLogger("scaffold.sglang")

DEFAULT_API_KEY_ENV = "SGLANG_API_KEY"
DEFAULT_URL = "http://127.0.0.1:30000"
PAUSE_MODES = ("abort", "retract", "in_place")


class SGLangEngine(Engine):
    """Generates with SGLang servers through their native ``/generate`` API (token ids and logprobs).

    Give ``url`` (one URL, a list, or comma-separated; default SGLang's own
    default address, ``http://127.0.0.1:30000``) to use running servers, or
    ``launch`` to start ``launch.count`` servers on this worker's ports. Requests are balanced by least
    in-flight requests; an episode sticks to one server. See the plugin README for every option.
    A request's ``sampling.constraint`` goes to SGLang as its native grammar parameter (``protocol.py``).
    """

    constraints = frozenset(CONSTRAINT_KINDS)

    def __init__(
        self,
        url: str | list[str] | None = None,
        launch: dict[str, Any] | None = None,
        tokenizer: str | None = None,
        trust_remote_code: bool = False,
        api_key_env: str | None = None,
        request_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        max_retries: int = 4,
        retry_backoff: float = 0.5,
        max_connections: int = 1024,
        setup_timeout: float = 1200.0,
        url_wait_timeout: float = 60.0,
        health_path: str = "/health_generate",
        send_sampling_seed: bool = False,
        sampling_extra: dict[str, Any] | None = None,
        sticky_episodes: bool = True,
    ):
        from .protocol import check_extra_sampling
        from .servers import parse_urls

        if url is not None and launch is not None:
            raise ValueError("set one of engine.url (running SGLang servers) and engine.launch (servers this "
                             "worker starts), not both")
        if url is None and launch is None:
            url = DEFAULT_URL  # where `python -m sglang.launch_server` listens by default
        for name, value, low in (("request_timeout", request_timeout, 0), ("connect_timeout", connect_timeout, 0),
                                 ("setup_timeout", setup_timeout, 0), ("url_wait_timeout", url_wait_timeout, 0)):
            if not value > low:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if retry_backoff < 0:
            raise ValueError(f"retry_backoff must be >= 0 seconds, got {retry_backoff}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.urls = parse_urls(url) if url is not None else []
        self.launch = None
        if launch is not None:
            from .launcher import parse_launch_options

            self.launch = parse_launch_options(launch)
        self.tokenizer_name = tokenizer
        self.trust_remote_code = trust_remote_code
        self.api_key_env = api_key_env
        self.request_timeout = float(request_timeout)
        self.connect_timeout = float(connect_timeout)
        self.max_retries = int(max_retries)
        self.retry_backoff = float(retry_backoff)
        self.max_connections = int(max_connections)
        self.setup_timeout = float(setup_timeout)
        self.url_wait_timeout = float(url_wait_timeout)
        self.health_path = health_path if health_path.startswith("/") else "/" + health_path
        self.send_sampling_seed = send_sampling_seed
        self.sampling_extra = check_extra_sampling(sampling_extra)
        self.sticky_episodes = sticky_episodes
        self.tokenizer: Any = None
        self.model_info: dict[str, Any] = {}
        self.server_info: dict[str, Any] = {}
        self._client: Any = None
        self._launcher: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resumed = asyncio.Event()  # set while requests may flow (cleared by pause)
        self._final_stats: dict[str, Any] = {}

    # -- lifecycle ------------------------------------------------------------
    def _api_key(self) -> str | None:
        name = self.api_key_env or DEFAULT_API_KEY_ENV
        value = os.environ.get(name)
        if self.api_key_env and not value:
            raise ConfigError(f"engine.api_key_env names the environment variable {name}, but it is not set; "
                              f"export {name}=<key>, or remove engine.api_key_env if the servers need no key")
        return value or None

    def _client_for(self, urls: list[str], api_key: str | None) -> Any:
        from .client import SGLangClient

        return SGLangClient(urls, api_key=api_key, request_timeout=self.request_timeout,
                            connect_timeout=self.connect_timeout, max_retries=self.max_retries,
                            retry_backoff=self.retry_backoff, max_connections=self.max_connections,
                            sticky=self.sticky_episodes, send_seed=self.send_sampling_seed,
                            extra_sampling=self.sampling_extra)

    async def start(self) -> None:
        """Launch (or find) the servers, wait until they are ready, load the tokenizer."""
        if self._client is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._resumed.set()
        api_key = self._api_key()
        tokenizer_job: asyncio.Future | None = None
        client = None
        try:
            if self.launch is not None:
                from scaffold_core.distributed.ports import rank_slice

                from .launcher import Launcher, default_log_dir

                info = self.run_info or RunInfo()
                port_range = info.port_range or rank_slice(info.rank, info.world_size)
                self._launcher = Launcher(self.launch, port_range=port_range,
                                          log_dir=default_log_dir(info.output_dir, self.launch.log_dir),
                                          rank=info.rank, local_rank=info.local_rank, api_key=api_key)
                servers = self._launcher.start()
                tokenizer_job = asyncio.ensure_future(self._load_tokenizer(self._launch_tokenizer_name()))
                client = self._client_for([s.url for s in servers], api_key)
                await client.open()
                # Servers take minutes to load: a tokenizer that cannot load fails the start at once.
                ready = asyncio.ensure_future(self._launcher.wait_ready(client.probe, self.setup_timeout,
                                                                        self.health_path))
                try:
                    await asyncio.wait({ready, tokenizer_job}, return_when=asyncio.FIRST_EXCEPTION)
                    if tokenizer_job.done() and tokenizer_job.exception() is not None:
                        tokenizer_job.result()
                    await ready
                finally:
                    ready.cancel()
                client.set_urls([s.url for s in servers])  # a server may have moved to another port
            else:
                client = self._client_for(self.urls, api_key)
                await client.open()
                if self.tokenizer_name is not None:
                    tokenizer_job = asyncio.ensure_future(self._load_tokenizer(self.tokenizer_name))
                await self._wait_urls(client)
            await self._read_server_info(client)
            if tokenizer_job is None:
                name = self.model_info.get("tokenizer_path") or self.model_info.get("model_path")
                if not name:
                    raise EngineError(f"{client.urls[0]}/model_info names no tokenizer_path or model_path; "
                                      "set engine.tokenizer", retryable=False)
                tokenizer_job = asyncio.ensure_future(self._load_tokenizer(str(name)))
            self.tokenizer = await tokenizer_job
        except BaseException:
            if tokenizer_job is not None and not tokenizer_job.done():
                tokenizer_job.cancel()
            if client is not None:
                await client.close()
            if self._launcher is not None:
                self._launcher.stop_now(timeout=min(self._launcher.options.stop_timeout, 10.0))
                self._launcher = None
            raise
        self._client = client

    def _launch_tokenizer_name(self) -> str:
        if self.tokenizer_name is not None:
            return self.tokenizer_name
        if self.launch is None:
            raise RuntimeError("the sglang engine has no launch options: it is not launching servers")
        args = list(self.launch.extra_args)
        for i, arg in enumerate(args):  # SGLang's own --tokenizer-path wins over the model path
            if arg == "--tokenizer-path" and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith("--tokenizer-path="):
                return arg.split("=", 1)[1]
        return self.launch.model_path

    async def _load_tokenizer(self, name: str) -> Any:
        from .tokenizer import load_tokenizer

        try:
            return await asyncio.to_thread(load_tokenizer, name, trust_remote_code=self.trust_remote_code)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"engine.tokenizer: {exc}") from exc

    async def _wait_urls(self, client: Any) -> None:
        """Wait (up to ``url_wait_timeout``) until every given server answers its health endpoint."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.url_wait_timeout
        delay = 0.1
        while True:
            remaining = deadline - loop.time()
            answers = await asyncio.gather(*(client.probe(u, self.health_path, max(0.1, min(10.0, remaining)))
                                             for u in client.urls))
            failing = [(u, why) for u, why in zip(client.urls, answers) if why is not None]
            if not failing:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise EngineError(
                    f"sglang server(s) not ready within engine.url_wait_timeout={self.url_wait_timeout:g} s: "
                    + "; ".join(f"{u}{self.health_path}: {why}" for u, why in failing)
                    + ". Check engine.url (or let scaffold start servers with engine.launch), that the servers "
                      "are running, and their logs")
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 1.5, 2.0)

    async def _read_server_info(self, client: Any) -> None:
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

    async def close(self) -> None:
        """Close the HTTP session and stop every server this engine launched. Safe to call twice."""
        client, self._client = self._client, None
        launcher, self._launcher = self._launcher, None
        if client is not None:
            self._final_stats = self._stats_of(client)  # metrics.json is written after close
        try:
            if client is not None:
                await client.close()
        finally:
            if launcher is not None:
                await launcher.stop()

    @property
    def server_urls(self) -> list[str]:
        """The URLs requests go to (given, or of the launched servers)."""
        if self._client is not None:
            return self._client.urls
        return list(self.urls)

    @property
    def launched(self) -> list[Any]:
        """The server processes this engine started (empty when it connects to given URLs)."""
        return list(self._launcher.servers) if self._launcher is not None else []

    def stats(self) -> dict[str, Any]:
        """Request, retry and error counters, per server too (kept after close for metrics.json)."""
        if self._client is None:
            return dict(self._final_stats)
        return self._stats_of(self._client)

    @staticmethod
    def _stats_of(client: Any) -> dict[str, Any]:
        out = dict(client.stats)
        out["servers"] = {s.url: {"requests": s.requests, "failures": s.failures} for s in client.pool.servers}
        return out

    # -- generation -----------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        client = self._client
        if client is None:
            raise EngineError("the sglang engine is not started: await engine.start() first", retryable=False)
        if not self._resumed.is_set():  # paused by this engine: hold new requests here, not in the server
            await self._resumed.wait()
        result = await client.generate(request)
        if not result.meta.pop("server_text", True) and result.output_ids:
            # The server sent ids only (--skip-tokenizer-init): decode them here, cut at the first stop string.
            result.text = response_text(self.tokenizer, result.output_ids, request.sampling.stop)
        return result

    # -- RL control -------------------------------------------------------------
    def _need_client(self) -> Any:
        if self._client is None:
            raise EngineError("the sglang engine is not started: await engine.start() first", retryable=False)
        return self._client

    async def update_weights_from_disk(self, model_path: str, *, weight_version: str | int | None = None,
                                       abort_all_requests: bool = False, flush_cache: bool = True,
                                       timeout: float | None = None) -> list[dict[str, Any]]:
        """Load new weights from ``model_path`` on every server (``POST /update_weights_from_disk``).

        Unless generation is paused (or ``abort_all_requests``), each server
        waits for its running requests to finish first. ``weight_version``
        labels the new policy; responses then carry it. Raises EngineError
        naming each server that failed.
        """
        payload: dict[str, Any] = {"model_path": str(model_path), "abort_all_requests": bool(abort_all_requests),
                                   "flush_cache": bool(flush_cache)}
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        return await self._need_client().call_all("POST", "/update_weights_from_disk", payload,
                                                  timeout=timeout or self.setup_timeout, expect_success=True)

    async def update_weights(self, source: Any = None, *, version: int | None = None) -> int:
        """The engine contract's weight update (:meth:`scaffold_core.engine.Engine.update_weights`).

        ``source`` is a checkpoint directory every server can read (a
        ``save_pretrained`` folder); it is loaded with
        :meth:`update_weights_from_disk`, labelled with the new version, which
        the servers then report on every response. Requests already running
        finish on the old weights (each server waits for them) and report
        the old version; requests after the call report the new one. On
        failure the old weights and version stay.
        """
        if not isinstance(source, (str, os.PathLike)):
            raise EngineError("the sglang engine loads new weights from a checkpoint directory the servers can "
                              f"read: update_weights('/path/to/checkpoint'); got {type(source).__name__}",
                              retryable=False)
        new_version = self.next_weight_version(version)
        await self.update_weights_from_disk(os.fspath(source), weight_version=new_version)
        self.weight_version = new_version
        return new_version

    async def pause_generation(self, mode: str = "retract") -> None:
        """Pause every server (``abort``: in-flight requests end as aborted and are retried by the runtime;
        ``retract``/``in_place``: they resume after :meth:`continue_generation`). New requests wait in the
        engine until then."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        client = self._need_client()
        self._resumed.clear()
        try:
            await client.call_all("POST", "/pause_generation", {"mode": mode})
        except BaseException:
            self._resumed.set()
            raise

    async def continue_generation(self) -> None:
        """Resume every server and release requests held by :meth:`pause_generation`."""
        try:
            await self._need_client().call_all("POST", "/continue_generation", {})
        finally:
            if self._resumed is not None:
                self._resumed.set()

    async def flush_cache(self) -> None:
        """Flush every server's prefix cache (servers refuse while requests run: pause first)."""
        await self._need_client().call_all("POST", "/flush_cache")

    async def abort_all(self) -> None:
        """Abort every request on every server (they come back as ``abort`` and are retried by the runtime)."""
        await self._need_client().call_all("POST", "/abort_request", {"abort_all": True})

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Run one of the control coroutines from another thread (e.g. a trainer's):
        ``engine.submit(engine.update_weights_from_disk(path)).result(timeout)``."""
        if self._loop is None:
            coro.close()
            raise EngineError("the sglang engine is not started: await engine.start() first", retryable=False)
        return asyncio.run_coroutine_threadsafe(coro, self._loop)
