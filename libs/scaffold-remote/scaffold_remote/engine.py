"""The half of a server engine (SGLang, vLLM) that does not depend on the server: :class:`RemoteEngine`.

A server engine plugin subclasses it and writes only its protocol: a
:class:`~scaffold_remote.client.WireProtocol` (request bodies,
responses), a :class:`~scaffold_remote.launcher.ServerSpec` (how its
servers start), and four coroutines: what the servers say about themselves
(``read_servers``), and how they pause, resume and load new weights. Everything
else is here, once:

* **Lifecycle.** ``url`` (one server or several) or ``launch`` (servers this
  worker starts on ports from its own slice), readiness with a bounded wait,
  the tokenizer (loaded while the servers start), stats, ``close``.
* **Requests.** Least-loaded routing with one episode per server, retries
  inside the engine (:mod:`.client`), text decoded locally when the server
  sends ids only.
* **Weight versions.** The engine's :attr:`~scaffold_core.engine.Engine.weight_version`
  moves only in :meth:`RemoteEngine.update_weights`; every result says which
  version sampled each token.
* **Partial rollouts across an update.** ``update_weights`` pauses the
  servers, loads, and resumes; requests that arrive meanwhile wait in the
  engine. ``pause_mode`` says what happens to the requests in flight:

  - ``abort`` (default): the servers abort them; the engine keeps each one's
    tokens (sampled by the old weights) and, after the update, continues it
    from where it stopped (prompt + tokens so far, the rest of
    ``max_tokens``). The caller gets one result whose ``versions`` say
    exactly which tokens each version sampled, e.g. ``[3, 3, 3, 4, 4]``.
  - ``keep``: the servers keep them (SGLang ``retract``, vLLM ``keep``) and
    finish them on the new weights. Per-token versions are exact where the
    server reports them (SGLang's ``weight_versions``); otherwise the
    result carries the older version for every token and
    ``meta["versions_exact"] = False`` (conservative for staleness).
  - ``wait``: the update waits until the requests in flight finish on the
    old weights.
* **Where a request's time went.** A request is one ``generate`` span of its
  episode (:mod:`scaffold_core.spans`), unless the server said how long its
  parts took: a protocol puts ``meta["server_timing"]`` (:data:`SERVER_TIMING`),
  seconds of ``decode`` and either ``queued`` and ``prefill`` or only
  ``first_token`` (queue and prefill together), and the engine places them
  back to back, ending when the answer arrived: ``decode`` last, then
  ``prefill``, and the time from the request's start to there as ``queued``
  (the client's own wait for a connection, the transfer and any failed
  attempt before the last included; a ``first_token`` part stays
  ``generate``). SGLang says so when started with
  ``--enable-metrics``; vLLM's HTTP answers carry no timing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Coroutine
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt

from scaffold_core.engine import Engine, RunInfo
from scaffold_core.errors import ConfigError, EngineError
from scaffold_core.generation import GenerationRequest, GenerationResult, version_number
from scaffold_core.plugins import Help
from scaffold_core.sampling import mix_seed
from scaffold_core.spans import META_KEY, clock, span
from scaffold_core.tokenizers import response_text

log = logging.getLogger("scaffold.remote")

PAUSE_MODES = ("abort", "keep", "wait")

# The options every server engine declares (its factory's signature), bounds and help declared once here.
RequestTimeout = Annotated[float, Gt(0), Help("seconds one request may take")]
ConnectTimeout = Annotated[float, Gt(0), Help("seconds to connect to a server")]
MaxRetries = Annotated[int, Ge(0), Help("retries of a failed request")]
RetryBackoff = Annotated[float, Ge(0), Help("seconds of the first retry's backoff (it grows exponentially)")]
MaxConnections = Annotated[int, Ge(1), Help("connections to the servers at once")]
SetupTimeout = Annotated[float, Gt(0), Help("seconds launched servers get to start")]
UrlWaitTimeout = Annotated[float, Gt(0), Help("seconds to wait for engine.url's servers to answer")]
PauseMode = Annotated[Literal["abort", "keep", "wait"], Help("what a weight update does to requests in flight")]
#: A request continued after this many pauses is failed instead (something keeps aborting it).
MAX_SEGMENTS = 64
#: The key of ``GenerationResult.meta`` a protocol reports the server's timing of a request under (seconds).
SERVER_TIMING = "server_timing"


def timing_spans(timing: Any, began: float, ended: float) -> list[tuple[str, float, float]] | None:
    """A request's spans from the server's timing of it (see the module's docstring), on
    :func:`scaffold_core.spans.clock` between ``began`` (the request's start) and ``ended`` (its answer); None
    when ``timing`` gives no usable ``decode``."""
    if not isinstance(timing, dict):
        return None

    def seconds(key: str) -> float | None:
        value = timing.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            return None  # missing, not a number, negative or NaN
        return float(value)

    decode = seconds("decode")
    if decode is None:
        return None
    decode_from = max(began, ended - decode)
    spans = [("decode", decode_from, ended)]
    prefill = seconds("prefill")
    if prefill is not None and seconds("queued") is not None:
        prefill_from = max(began, decode_from - prefill)
        spans.insert(0, ("prefill", prefill_from, decode_from))
        if prefill_from > began:
            spans.insert(0, ("queued", began, prefill_from))
    elif decode_from > began:  # queue and prefill not told apart
        spans.insert(0, ("generate", began, decode_from))
    return spans


class RemoteEngine(Engine):
    """Generates on inference servers over HTTP; see the module docstring. Subclassed per server."""

    #: How the server is named in messages and in the log directory (``sglang``, ``vllm``).
    server_name = "remote"
    default_url = "http://127.0.0.1:8000"
    default_api_key_env = "SCAFFOLD_API_KEY"
    #: The ``engine.launch`` options class (a LaunchOptions subclass naming the server's managed flags).
    launch_options: Any = None
    #: Pause modes the server knows beyond abort, keep and wait (accepted by :meth:`pause_generation`).
    extra_pause_modes: tuple[str, ...] = ()

    def __init__(self, *, url: str | list[str] | None, launch: dict[str, Any] | None, tokenizer: str | None,
                 trust_remote_code: bool, api_key_env: str | None, request_timeout: float, connect_timeout: float,
                 max_retries: int, retry_backoff: float, max_connections: int, setup_timeout: float,
                 url_wait_timeout: float, health_path: str, sticky_episodes: bool, pause_mode: str):
        from .launcher import LaunchOptions, parse_launch_options
        from .servers import parse_urls

        if url is not None and launch is not None:
            raise ValueError(f"set one of engine.url (running {self.server_name} servers) and engine.launch "
                             "(servers this worker starts), not both")
        if url is None and launch is None:
            url = self.default_url
        self.urls = parse_urls(url) if url is not None else []
        self.launch = parse_launch_options(launch, self.launch_options or LaunchOptions) if launch is not None \
            else None
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
        self.sticky_episodes = sticky_episodes
        self.pause_mode = pause_mode
        self.tokenizer: Any = None
        self._client: Any = None
        self._launcher: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resumed = asyncio.Event()  # set while requests may flow (cleared while paused)
        self._update_lock: asyncio.Lock | None = None
        self._pauses = 0  # pauses begun: an abort seen after one began was caused by it
        #: The mode of the pause in force (None while generation runs).
        self.paused_mode: str | None = None
        self._updates = 0  # weight updates done: a request that saw one may hold tokens of two versions
        self._final_stats: dict[str, Any] = {}
        self._counts = {"continued": 0, "updates": 0, "inexact_versions": 0}

    # -- what a server plugin writes ----------------------------------------------
    def protocol(self) -> Any:  # pragma: no cover - abstract
        """The :class:`~scaffold_remote.client.WireProtocol` requests start with."""
        raise NotImplementedError

    def server_spec(self) -> Any:  # pragma: no cover - abstract
        """The :class:`~scaffold_remote.launcher.ServerSpec` ``engine.launch`` starts servers with."""
        raise NotImplementedError

    async def read_servers(self, client: Any) -> str | None:  # pragma: no cover - abstract
        """Read what the servers say about themselves once they are ready (set ``context_length``, switch the
        client's protocol if they lack an endpoint); return the tokenizer they serve, if they say."""
        raise NotImplementedError

    async def pause_servers(self, mode: str) -> None:  # pragma: no cover - abstract
        """Pause every server in ``mode`` (``abort``, ``keep``, ``wait``, or one of ``extra_pause_modes``)."""
        raise NotImplementedError

    async def resume_servers(self) -> None:  # pragma: no cover - abstract
        """Resume every server."""
        raise NotImplementedError

    async def load_weights(self, source: Any, version: int) -> None:  # pragma: no cover - abstract
        """Make every server serve the weights ``source`` names, as ``version``; raise EngineError if it cannot."""
        raise NotImplementedError

    def check_weights_source(self, source: Any) -> None:
        """Raise EngineError naming what is accepted when ``source`` is not (before anything is paused)."""

    # -- lifecycle ------------------------------------------------------------
    def api_key(self) -> str | None:
        """The API key from the environment (``api_key_env``, default the server's own variable)."""
        name = self.api_key_env or self.default_api_key_env
        value = os.environ.get(name)
        if self.api_key_env and not value:
            raise ConfigError(f"engine.api_key_env names the environment variable {name}, but it is not set; "
                              f"export {name}=<key>, or remove engine.api_key_env if the servers need no key")
        return value or None

    def _client_for(self, urls: list[str], api_key: str | None) -> Any:
        from .client import RemoteClient

        return RemoteClient(urls, self.protocol(), api_key=api_key,
                            api_key_env=self.api_key_env or self.default_api_key_env,
                            request_timeout=self.request_timeout, connect_timeout=self.connect_timeout,
                            max_retries=self.max_retries, retry_backoff=self.retry_backoff,
                            max_connections=self.max_connections, sticky=self.sticky_episodes)

    async def start(self) -> None:
        """Launch (or find) the servers, wait until they are ready, load the tokenizer."""
        if self._client is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._resumed.set()
        self._update_lock = asyncio.Lock()
        api_key = self.api_key()
        tokenizer_job: asyncio.Future | None = None
        client = None
        try:
            if self.launch is not None:
                client, tokenizer_job = await self._start_launched(api_key)
            else:
                client = self._client_for(self.urls, api_key)
                await client.open()
                if self.tokenizer_name is not None:
                    tokenizer_job = asyncio.ensure_future(self._load_tokenizer(self.tokenizer_name))
                await self._wait_urls(client)
            served = await self.read_servers(client)
            if tokenizer_job is None:
                if not served:
                    raise EngineError(f"{client.urls[0]} does not say which model it serves; set engine.tokenizer",
                                      retryable=False)
                tokenizer_job = asyncio.ensure_future(self._load_tokenizer(str(served)))
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

    async def _start_launched(self, api_key: str | None) -> tuple[Any, asyncio.Future]:
        from scaffold_core.distributed.ports import rank_slice

        from .launcher import Launcher, default_log_dir

        assert self.launch is not None
        info = self.run_info or RunInfo()
        port_range = info.port_range or rank_slice(info.rank, info.world_size)
        self._launcher = Launcher(self.launch, self.server_spec(), port_range=port_range,
                                  log_dir=default_log_dir(info.output_dir, self.launch.log_dir, self.server_name),
                                  rank=info.rank, local_rank=info.local_rank, api_key=api_key)
        servers = self._launcher.start()
        tokenizer_job = asyncio.ensure_future(self._load_tokenizer(self.tokenizer_name or self.launch_tokenizer()))
        client = self._client_for([s.url for s in servers], api_key)
        await client.open()
        # Servers take minutes to load: a tokenizer that cannot load fails the start at once.
        ready = asyncio.ensure_future(self._launcher.wait_ready(client.probe, self.setup_timeout, self.health_path))
        try:
            await asyncio.wait({ready, tokenizer_job}, return_when=asyncio.FIRST_EXCEPTION)
            if tokenizer_job.done() and tokenizer_job.exception() is not None:
                tokenizer_job.result()
            await ready
        except BaseException:
            await client.close()
            raise
        finally:
            ready.cancel()
        client.set_urls([s.url for s in servers])  # a server may have moved to another port
        return client, tokenizer_job

    def launch_tokenizer(self) -> str:
        """The tokenizer of the launched model (a plugin reads its server's own tokenizer flag here)."""
        assert self.launch is not None
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
                    f"{self.server_name} server(s) not ready within engine.url_wait_timeout="
                    f"{self.url_wait_timeout:g} s: " + "; ".join(f"{u}{self.health_path}: {why}" for u, why in failing)
                    + ". Check engine.url (or let scaffold start servers with engine.launch), that the servers "
                      "are running, and their logs")
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 1.5, 2.0)

    async def close(self) -> None:
        """Close the connections and stop every server this engine launched. Safe to call twice."""
        client, self._client = self._client, None
        launcher, self._launcher = self._launcher, None
        if client is not None:
            self._final_stats = self._stats_of(client)  # metrics.json is written after close
        try:
            if client is not None:
                await client.close()
        finally:
            self._resumed.set()  # nothing waits for a resume that will not come
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
        """Request, retry, error and update counters, per server too (kept after close for metrics.json)."""
        if self._client is None:
            return dict(self._final_stats)
        return self._stats_of(self._client)

    def _stats_of(self, client: Any) -> dict[str, Any]:
        out = dict(client.stats)
        out.update(self._counts)
        out["servers"] = {s.url: {"requests": s.requests, "failures": s.failures} for s in client.pool.servers}
        return out

    def need_client(self) -> Any:
        if self._client is None:
            raise EngineError(f"the {self.server_name} engine is not started: await engine.start() first",
                              retryable=False)
        return self._client

    # -- generation -----------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        client = self.need_client()
        if not self._resumed.is_set():  # paused by this engine: hold new requests here, not in the server
            with span("weight_wait"):
                await self._resumed.wait()
        pauses, updates, version = self._pauses, self._updates, self.weight_version
        began = clock()
        result = await client.generate(request)
        if result.finish_reason == "abort" and self._pauses != pauses:  # aborted by this engine's own pause
            return await self._continue(request, result, version)
        if SERVER_TIMING in result.meta:
            spans = timing_spans(result.meta[SERVER_TIMING], began, clock())
            if spans:
                result.meta[META_KEY] = spans
        self._stamp(result, version, updates)
        if not result.meta.pop("server_text", True) and result.output_ids:
            # The server sent ids only: decode them here, cut at the first stop string.
            result.text = response_text(self.tokenizer, result.output_ids, request.sampling.stop)
        return result

    def _stamp(self, result: GenerationResult, version: int, updates: int) -> None:
        """Say which version sampled the tokens: the server's spans, else the version the request started with."""
        spans = result.meta.get("weight_versions")
        if spans and len({s.get("version") for s in spans if isinstance(s, dict)}) > 1:
            versions = [version] * len(result.output_ids)
            for span in spans:
                number = version_number(span.get("version"))
                versions[int(span.get("start", 0)):int(span.get("end", 0))] = \
                    [number] * (int(span.get("end", 0)) - int(span.get("start", 0)))
            result.versions = versions[:len(result.output_ids)]
            result.weight_version = min(result.versions) if result.versions else version
        elif self._updates != updates:  # kept across an update the server does not attribute: say the older one
            result.weight_version = version
            result.meta["versions_exact"] = False
            self._counts["inexact_versions"] += 1
        elif result.weight_version is None:
            result.weight_version = version

    async def _continue(self, request: GenerationRequest, first: GenerationResult, version: int
                        ) -> GenerationResult:
        """Finish a request a pause aborted: keep its tokens and go on from them after the resume."""
        ids: list[int] = list(first.output_ids)
        logprobs: list[float] = list(first.logprobs)
        versions: list[int] = [version] * len(ids)
        tops = list(first.top_logprobs) if first.top_logprobs is not None else None
        sampling = request.sampling
        last = first
        attempts = int(first.meta.get("attempts", 1))
        parts = 1
        for segment in range(1, MAX_SEGMENTS + 1):
            remaining = sampling.max_tokens - len(ids)
            if remaining <= 0 or self._stopped(ids, sampling.stop):
                finish = "length" if remaining <= 0 else "stop"
                break
            self._counts["continued"] += 1
            if not self._resumed.is_set():
                with span("weight_wait"):
                    await self._resumed.wait()
            pauses, version = self._pauses, self.weight_version
            seed = None if request.seed is None else mix_seed(request.seed, segment)
            more = GenerationRequest(f"{request.request_id}+{segment}", [*request.prompt_ids, *ids],
                                     sampling.replace(max_tokens=remaining), seed=seed, episode_id=request.episode_id)
            last = await self.need_client().generate(more)
            parts += 1
            attempts += int(last.meta.get("attempts", 1))
            ids += last.output_ids
            logprobs += last.logprobs
            versions += [version] * len(last.output_ids)
            if tops is not None:
                tops = tops + list(last.top_logprobs) if last.top_logprobs is not None else None
            if not (last.finish_reason == "abort" and self._pauses != pauses):
                finish = last.finish_reason
                break
        else:
            raise EngineError(f"request {request.request_id} was aborted by {MAX_SEGMENTS} pauses in a row",
                              retryable=True)
        meta = dict(last.meta)
        meta.pop("server_text", None)
        meta.update(segments=parts, attempts=attempts)  # the parts the result was generated in
        return GenerationResult(output_ids=ids, logprobs=logprobs, finish_reason=finish,
                                text=response_text(self.tokenizer, ids, sampling.stop), weight_version=min(versions,
                                default=version), versions=versions, meta=meta, top_logprobs=tops)

    def _stopped(self, ids: list[int], stop: tuple[str, ...]) -> bool:
        """Whether the tokens so far already hold a stop string (the server saw only the aborted part)."""
        if not stop or not ids or self.tokenizer is None:
            return False
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return any(s and s in text for s in stop)

    # -- weights and pauses -----------------------------------------------------
    async def update_weights(self, source: Any = None, *, version: int | None = None) -> int:
        """The engine contract's weight update: pause the servers (``pause_mode``), load ``source`` on every
        server, move :attr:`weight_version`, resume. On failure the old version stays and the servers resume."""
        self.need_client()
        new_version = self.next_weight_version(version)
        self.check_weights_source(source)
        assert self._update_lock is not None
        async with self._update_lock:
            await self.pause_generation(self.pause_mode)
            try:
                await self.load_weights(source, new_version)
                self.weight_version = new_version
                self._updates += 1
                self._counts["updates"] += 1
            finally:
                await self.continue_generation()
        return new_version

    async def pause_generation(self, mode: str | None = None) -> None:
        """Pause every server (``mode``: ``abort``, ``keep`` or ``wait``; default ``pause_mode``). Requests
        that arrive meanwhile wait in the engine; aborted ones are continued after :meth:`continue_generation`."""
        mode = mode or self.pause_mode
        if mode not in PAUSE_MODES + self.extra_pause_modes:
            raise ValueError(f"pause mode must be one of {', '.join(PAUSE_MODES + self.extra_pause_modes)}, "
                             f"got {mode!r}")
        self.need_client()
        self._resumed.clear()
        self._pauses += 1
        self.paused_mode = mode
        try:
            await self.pause_servers(mode)
        except BaseException:
            self.paused_mode = None
            self._resumed.set()
            raise

    async def continue_generation(self) -> None:
        """Resume every server and release the requests held by :meth:`pause_generation`."""
        try:
            await self.resume_servers()
        finally:
            self.paused_mode = None
            self._resumed.set()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Run one of the control coroutines from another thread (e.g. a trainer's):
        ``engine.submit(engine.update_weights(path)).result(timeout)``."""
        if self._loop is None:
            coro.close()
            raise EngineError(f"the {self.server_name} engine is not started: await engine.start() first",
                              retryable=False)
        return asyncio.run_coroutine_threadsafe(coro, self._loop)
