"""What the protocol test servers of server engines share (tests and benchmarks only: no GPU, no server package).

A server engine plugin's test server (``tests/<server>_test_server.py``)
writes only its server's HTTP schemas: routes, request validation, response
and error bodies. This module holds the rest, written once from the
behaviour SGLang and vLLM document:

* :class:`RandomBackend` samples deterministic pseudo-random tokens (a
  function of the prompt, and of the seed or request id when sampling), fast
  enough for a client benchmark; :class:`TransformersBackend` runs scaffold's
  embedded engine (a real model on CPU).
* :class:`FakeServer` is the state both servers have: requests in flight,
  pausing (``abort``: in-flight requests end aborted with their partial
  output; ``keep``: they freeze and go on after the resume; ``wait``: the
  pause waits for them to finish; new requests wait either way), the weights
  label each token is sampled under (so tests can check the versions a
  client reports against what the server really did), injected failures
  (an HTTP status, or a connection dropped after the request was read), and
  a record of every response.
* :class:`running` serves a test server in process; :func:`serve_forever`
  and :func:`main` run one as a subprocess (the launcher tests start it in
  place of the real server, with the same flag spelling), and
  :class:`ServerSubprocess` starts one from a test (always stopped by its
  fixture: :func:`server_fixtures` makes a plugin's conftest fixtures);
  :func:`serve_engine_in_process` serves one with a started engine for a
  class of checks; :func:`run_rollout` runs a small rollout on a plugin's
  engine; :func:`free_port_range`, :func:`free_port`, :func:`run` and
  :func:`pid_alive` are what such tests need besides.

Needs aiohttp (a test dependency of the server plugins).
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import hmac
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass(eq=False)
class Live:
    """One request being generated."""

    rid: str
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    abort_message: str = "Aborted"
    retractions: int = 0


@dataclass
class Sampling:
    """The sampling parameters a backend honours, whatever the server called them."""

    max_tokens: int
    temperature: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    top_logprobs: int = 0  # how many alternatives per position (0: none)
    top_p: float = 1.0
    top_k: int = -1


@dataclass
class Generated:
    """One request's output: ids, logprobs, how it ended, and the weights label each token was sampled under."""

    ids: list[int]
    logprobs: list[float]
    finish: str  # stop, length or abort
    matched: int | str | None = None  # the stop token id or stop string that ended it
    message: str = ""  # why it was aborted
    text: str | None = None  # decoded (cut at a stop string) when the server has a tokenizer
    labels: list[str] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] | None = None


# ---------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------


class RandomBackend:
    """Deterministic pseudo-random tokens: a function of the prompt (and the seed or request id when sampling)."""

    def __init__(self, *, vocab_size: int = 49152, eos_token_id: int = 2, mean_tokens: int = 16,
                 token_delay_s: float = 0.0, seed: int = 0):
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

    def _rng(self, input_ids: list[int], sampling: Sampling, rid: str) -> random.Random:
        h = hashlib.blake2b(array.array("q", input_ids).tobytes(), digest_size=8, key=str(self.seed).encode())
        if sampling.temperature >= 1e-6:  # sampled: each request draws its own tokens
            h.update(str(sampling.seed).encode() if sampling.seed is not None else rid.encode())
        return random.Random(int.from_bytes(h.digest(), "big"))

    def prompt_logprobs(self, ids: list[int], top: int = 0) -> list[tuple[float, list[tuple[int, float]]] | None]:
        """Teacher-forced scores of ``ids`` (a prompt-logprob request): for each position after the first, the
        logprob of its token given the tokens before it, a function of those tokens only, and ``top``
        alternatives (most likely first, ids distinct from each other); None for the first position."""
        out: list[tuple[float, list[tuple[int, float]]] | None] = [None]
        for j in range(1, len(ids)):
            h = hashlib.blake2b(array.array("q", ids[:j + 1]).tobytes(), digest_size=8,
                                key=f"score-{self.seed}".encode())
            rng = random.Random(int.from_bytes(h.digest(), "big"))
            logprob = -round(rng.random() * 4.0, 6) - 1e-3
            alternatives = rng.sample(range(3, self.vocab_size), top) if top else []
            out.append((logprob, [(t, -round(0.1 * (k + 1) + rng.random() / 20, 6))
                                  for k, t in enumerate(alternatives)]))
        return out

    async def generate(self, server: FakeServer, live: Live, input_ids: list[int], sampling: Sampling) -> Generated:
        rng = self._rng(input_ids, sampling, live.rid)
        natural = rng.randint(1, 2 * self.mean_tokens)
        stop_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop_ids.add(self.eos_token_id)
        decode = server.decode
        stops = [t for t in sampling.stop if t]
        out = Generated([], [], "", tops=[] if sampling.top_logprobs else None)
        while not out.finish:
            if len(out.ids) >= sampling.max_tokens:
                out.finish = "length"
                break
            if self.token_delay_s:
                await server.step_gate(live, self.token_delay_s)
            if live.abort.is_set():
                out.finish, out.message = "abort", live.abort_message
                break
            if len(out.ids) + 1 == natural and not sampling.ignore_eos:
                token = self.eos_token_id
            else:
                token = rng.randrange(3, self.vocab_size)
            out.ids.append(token)
            out.logprobs.append(-round(rng.random() * 4.0, 6) - 1e-3)
            out.labels.append(server.weights)
            if out.tops is not None:  # alternatives, most likely first (ids distinct from each other)
                alternatives = rng.sample(range(3, self.vocab_size), sampling.top_logprobs)
                out.tops.append([(t, -round(0.1 * (k + 1) + rng.random() / 20, 6)) for k, t in enumerate(alternatives)])
            if token in stop_ids:
                out.finish, out.matched = "stop", token
            elif decode is not None and stops:
                decoded = decode(out.ids, skip_special_tokens=True)
                hits = [(decoded.find(t), t) for t in stops if t in decoded]
                if hits:
                    at, matched = min(hits)
                    out.finish, out.matched, out.text = "stop", matched, decoded[:at]
        if decode is not None and out.text is None:
            out.text = decode(out.ids, skip_special_tokens=True)
        return out


class TransformersBackend:
    """scaffold's embedded transformers engine (a real model, CPU); responses carry text."""

    def __init__(self, model: str | None, max_batch_size: int = 8):
        from scaffold_transformers.transformers_engine import TransformersEngine

        self.engine = TransformersEngine(model=model, max_batch_size=max_batch_size, threads=1)

    async def start(self) -> None:
        await self.engine.start()
        self.eos_token_id = self.engine.tokenizer.eos_token_id
        self.vocab_size = len(self.engine.tokenizer)

    async def close(self) -> None:
        await self.engine.close()

    def encode_text(self, text: str) -> list[int]:
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

    async def generate(self, server: FakeServer, live: Live, input_ids: list[int], sampling: Sampling) -> Generated:
        from scaffold_core.generation import GenerationRequest
        from scaffold_core.sampling import SamplingParams

        sp = SamplingParams(max_tokens=max(1, sampling.max_tokens), temperature=sampling.temperature,
                            top_p=sampling.top_p, top_k=sampling.top_k, stop=tuple(sampling.stop),
                            stop_token_ids=tuple(sampling.stop_token_ids), seed=sampling.seed)
        gen = asyncio.ensure_future(self.engine.generate(GenerationRequest(live.rid, input_ids, sp,
                                                                           seed=sampling.seed)))
        aborted = asyncio.ensure_future(live.abort.wait())
        try:
            await asyncio.wait([gen, aborted], return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
        if not gen.done():
            gen.cancel()
            return Generated([], [], "abort", message=live.abort_message, text="")
        result = gen.result()
        matched = result.output_ids[-1] if result.finish_reason == "stop" and result.output_ids else None
        return Generated(list(result.output_ids), list(result.logprobs), result.finish_reason, matched,
                         text=result.text, labels=[server.weights] * len(result.output_ids))


def make_backend(args: Any) -> Any:
    """The backend the command-line flags ask for (``--backend``, ``--vocab-size``, ``--token-delay-ms``...)."""
    if args.backend == "transformers":
        return TransformersBackend(None if args.model_path == DEFAULT_MODEL else args.model_path)
    return RandomBackend(vocab_size=args.vocab_size, eos_token_id=args.eos_token_id, mean_tokens=args.mean_tokens,
                         token_delay_s=args.token_delay_ms / 1000.0, seed=args.random_seed)


# ---------------------------------------------------------------------------
# The state servers share
# ---------------------------------------------------------------------------


class FakeServer:
    """Requests in flight, pauses, weights, injected failures and the response record of one test server."""

    #: Paths that answer without an API key.
    open_paths: tuple[str, ...] = ("/health",)

    def __init__(self, *, model_path: str = DEFAULT_MODEL, backend: Any = None, api_key: str | None = None,
                 context_length: int = 8192, warmup_delay_s: float = 0.0, never_ready: bool = False,
                 fail_first: int = 0, fail_status: int = 503, drop_first: int = 0, tokenizer_path: str | None = None,
                 port: int | None = None, weights: str = "default"):
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path or model_path
        self.backend = backend or RandomBackend()
        #: The random backend's detokenizer (text, stop strings): the byte tokenizer, or a tokenizer directory's.
        self.decode: Callable[..., str] | None = None
        if self.tokenizer_path == "builtin:byte":
            from scaffold_core.tokenizers import ByteTokenizer

            self.decode = ByteTokenizer().decode
        elif os.path.isdir(self.tokenizer_path) and isinstance(self.backend, RandomBackend):
            from transformers import AutoTokenizer

            tokenizer: Any = AutoTokenizer.from_pretrained(self.tokenizer_path)
            self.decode = tokenizer.decode
        self.api_key = api_key
        self.context_length = context_length
        self.never_ready = never_ready
        self.ready_at = time.monotonic() + warmup_delay_s
        self.port = port
        self.weights = weights  # the label of the weights tokens are sampled with now
        self.live: dict[str, Live] = {}
        self.waiting = 0
        self.resume = asyncio.Event()
        self.resume.set()
        self.paused_mode: str | None = None
        self.drained = asyncio.Event()
        self.drained.set()
        self.fail_remaining = fail_first
        self.fail_status = fail_status
        self.drop_remaining = drop_first
        self.requests_seen = 0
        self.dropped = 0
        self.responses: list[dict[str, Any]] = []
        self.control_log: list[tuple[str, Any]] = []
        self.auth_headers: list[tuple[str, str | None]] = []
        self.record_file: Any = None

    @property
    def is_up(self) -> bool:
        return not self.never_ready and time.monotonic() >= self.ready_at

    def app(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def authorized(self, path: str, header: str | None) -> bool:
        """Whether a request to ``path`` with this ``Authorization`` header may pass (recorded for tests)."""
        if path in self.open_paths:
            return True
        self.auth_headers.append((path, header))
        if self.api_key is None:
            return True
        expected = f"Bearer {self.api_key}"
        return header is not None and hmac.compare_digest(header.encode(), expected.encode())

    def injected(self) -> str | None:
        """``"fail"`` or ``"drop"`` while injected failures remain (failures first), else None."""
        if self.fail_remaining > 0:
            self.fail_remaining -= 1
            return "fail"
        if self.drop_remaining > 0:
            self.drop_remaining -= 1
            self.dropped += 1
            return "drop"
        return None

    # -- generation -----------------------------------------------------------
    async def step_gate(self, live: Live, delay: float) -> None:
        """Per-token pacing (an abort cuts it short); a request frozen by a ``keep`` pause waits here."""
        try:
            await asyncio.wait_for(live.abort.wait(), delay)
        except asyncio.TimeoutError:
            pass
        if self.paused_mode == "keep" and not self.resume.is_set() and not live.abort.is_set():
            await self.until_continued_or_aborted(live)

    async def until_continued_or_aborted(self, live: Live) -> None:
        """Wait until generation continues (after a pause) or this request is aborted."""
        waiter = asyncio.ensure_future(self.resume.wait())
        aborted = asyncio.ensure_future(live.abort.wait())
        try:
            await asyncio.wait([waiter, aborted], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            aborted.cancel()

    async def run_one(self, rid: str, prompt: list[int], sampling: Sampling) -> tuple[Generated, Live]:
        """Generate for one request: it waits while generation is paused, and can be aborted."""
        live = Live(rid)
        self.live[rid] = live
        self.drained.clear()
        try:
            if not self.resume.is_set():  # paused: new requests wait inside the server until the resume
                self.waiting += 1
                try:
                    await self.until_continued_or_aborted(live)
                finally:
                    self.waiting -= 1
            if live.abort.is_set():
                out = Generated([], [], "abort", message="Abort in waiting queue")
            else:
                out = await self.backend.generate(self, live, prompt, sampling)
        finally:
            del self.live[rid]
            if not self.live:
                self.drained.set()
        record = {"rid": rid, "input_ids": prompt, "output_ids": out.ids, "logprobs": out.logprobs,
                  "finish_reason": out.finish, "labels": out.labels, "seed": sampling.seed,
                  "max_tokens": sampling.max_tokens}
        self.responses.append(record)
        if self.record_file is not None:
            import json

            self.record_file.write(json.dumps(record) + "\n")
        return out, live

    # -- control ----------------------------------------------------------------
    def abort_all(self, message: str = "Aborted") -> int:
        for live in self.live.values():
            live.abort_message = message
            live.abort.set()
        return len(self.live)

    async def pause(self, mode: str) -> None:
        """``abort``: abort what runs and return once it ended; ``wait``: return once it finished; ``keep``:
        freeze it. New requests wait until :meth:`continue_all` either way."""
        self.paused_mode = mode
        self.resume.clear()
        if mode == "keep":
            for live in self.live.values():  # frozen (SGLang: retracted to the waiting queue) until the resume
                live.retractions += 1
        if mode == "abort":
            self.abort_all()
        if mode in ("abort", "wait"):
            await asyncio.wait_for(self.wait_running(), 60)

    async def wait_running(self) -> None:
        """Until no request is generating (those waiting for the resume do not count)."""
        while len(self.live) > self.waiting:
            await asyncio.sleep(0.005)

    def continue_all(self) -> None:
        self.paused_mode = None
        self.resume.set()

    def shutdown(self) -> None:
        self.abort_all("server shutting down")
        self.resume.set()
        if self.record_file is not None:
            self.record_file.close()
            self.record_file = None


# ---------------------------------------------------------------------------
# Serving: in process (tests) and as a subprocess (launcher tests, benchmarks)
# ---------------------------------------------------------------------------


class running:
    """``async with running(server) as url:`` serves ``server`` on an ephemeral loopback port."""

    def __init__(self, server: FakeServer, host: str = "127.0.0.1", port: int = 0):
        self.server = server
        self.host = host
        self.port = port

    async def __aenter__(self) -> str:
        from aiohttp import web

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
        self.server.shutdown()
        await self.runner.cleanup()
        await self.server.backend.close()


def add_common_flags(p: Any) -> None:
    """The test-only flags every test server takes (besides its server's own flag spelling)."""
    p.add_argument("--backend", choices=("random", "transformers"), default="random")
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--eos-token-id", type=int, default=2)
    p.add_argument("--mean-tokens", type=int, default=16)
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    p.add_argument("--load-delay", type=float, default=0.0, help="seconds before the port listens")
    p.add_argument("--warmup-delay", type=float, default=0.0, help="seconds of 503 from health after listening")
    p.add_argument("--never-ready", action="store_true", help="the health endpoint answers 503 forever")
    p.add_argument("--crash-after-load", action="store_true", help="print an error and exit 1 instead of serving")
    p.add_argument("--fail-first", type=int, default=0, help="answer the first N generations with --fail-status")
    p.add_argument("--fail-status", type=int, default=503)
    p.add_argument("--drop-first", type=int, default=0, help="drop the connection of the next N generations")
    p.add_argument("--record", help="append every generation to this JSONL file")
    p.add_argument("--pid-file", help="write this process's pid here once listening")
    p.add_argument("--hold-port", type=int, action="append", default=[],
                   help="bind and listen on this port too (as a server's internal ports)")
    p.add_argument("--reuse-port-workers", type=int, default=1,
                   help="serve from N processes sharing the port (SO_REUSEPORT), for benchmarks")


def hold_port(host: str, port: int) -> socket.socket:
    """Bind and listen on ``port`` the way a server's internal rendezvous holds its ports."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, port))
    s.listen(8)
    return s


async def serve_forever(args: Any, make_server: Callable[[Any, Any], FakeServer], banner: str) -> int:
    """Serve ``make_server(args, backend)`` on ``args.host``/``args.port`` until SIGTERM or SIGINT."""
    from aiohttp import web

    log = print
    log(banner, flush=True)
    held: list[socket.socket] = []
    try:
        for port in args.hold_port:
            held.append(hold_port(args.host, port))
    except OSError as exc:
        log(f"ERROR: cannot bind port {exc}: address already in use?", flush=True)
        return 1
    if args.load_delay:
        await asyncio.sleep(args.load_delay)
    if args.crash_after_load:
        log("ERROR: simulated crash while loading the model (RuntimeError: CUDA out of memory)", flush=True)
        return 1
    backend = make_backend(args)
    server = make_server(args, backend)
    if args.record:
        server.record_file = open(args.record, "a", encoding="utf-8", buffering=1)
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
        server.shutdown()
        await runner.cleanup()
        await backend.close()
        for s in held:
            s.close()
    return 0


def main(args: Any, make_server: Callable[[Any, Any], FakeServer], banner: str) -> int:
    """Run the server (in ``--reuse-port-workers`` processes sharing the port, for benchmarks)."""
    workers = max(1, args.reuse_port_workers)
    if workers == 1:
        return asyncio.run(serve_forever(args, make_server, banner))
    children = []
    for _ in range(workers - 1):
        pid = os.fork()
        if pid == 0:
            args.hold_port = []
            args.pid_file = None
            os._exit(asyncio.run(serve_forever(args, make_server, banner)))
        children.append(pid)
    try:
        return asyncio.run(serve_forever(args, make_server, banner))
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


# ---------------------------------------------------------------------------
# What the tests of server engines need besides
# ---------------------------------------------------------------------------


def free_port_range(size: int = 64) -> tuple[int, int]:
    """A random block of ports below the ephemeral range, so concurrent test runs rarely pick the same one."""
    from scaffold_core.distributed.ports import job_port_range

    lo, hi = job_port_range()
    start = random.randrange(lo, hi - size)
    return start, start + size - 1


def free_port() -> int:
    """One port free now, from a random place below the ephemeral range."""
    from scaffold_core.distributed.ports import try_reserve

    for _ in range(200):
        lo, _hi = free_port_range(1)
        reservation = try_reserve(lo, "")
        if reservation is not None:
            return reservation.release()
    raise RuntimeError("no free port found")


def run(coro: Any, timeout: float = 60.0) -> Any:
    """Run ``coro`` on a fresh event loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _die_with_parent() -> None:  # in the child between fork and exec: a killed test run takes its servers along
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: kill() at teardown is the only stop
        pass


class ServerSubprocess:
    """A test server as a subprocess in its own process group: ``command + args + --port P``; ``kill()`` it.
    Started from the main thread, it dies with the test run, so a run killed before its teardown leaves no server
    behind."""

    def __init__(self, tmp: Path, command: list[str], *args: str, port: int | None = None,
                 env: dict[str, str] | None = None):
        self.port = port or free_port()
        self.command = list(command)
        self.args = list(args)
        self.env = env
        self.log = tmp / f"test-server-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerSubprocess:
        argv = [*self.command, *self.args, "--port", str(self.port)]
        env = None if self.env is None else {**os.environ, **self.env}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                         # the signal comes when the starting *thread* ends: only the main one
                                         preexec_fn=_die_with_parent
                                         if threading.current_thread() is threading.main_thread() else None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"test server exited: {self.log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"test server did not listen within {timeout} s: {self.log.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


def records(path: Path) -> list[dict[str, Any]]:
    """The JSONL records a test server wrote with ``--record``."""
    import json

    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def assert_token_faithful(episodes: list[dict[str, Any]], served: list[dict[str, Any]]) -> None:
    """Every trajectory's generated tokens and logprobs are exactly what the server returned (``served``:
    :func:`records`; ``episodes``: the run's ledger records, token arrays as lists)."""
    by_tokens: dict[tuple, list[dict[str, Any]]] = {}
    for r in served:
        by_tokens.setdefault((tuple(r["input_ids"]), tuple(r["output_ids"])), []).append(r)
    checked = expected = 0
    for episode in episodes:
        expected += len(episode["samples"])
        for traj in episode["trajectories"]:
            n = traj["prompt_len"]
            prompt, output = traj["input_ids"][:n], traj["input_ids"][n:]
            matches = by_tokens.get((tuple(prompt), tuple(output)))
            assert matches, f"episode {episode['episode_id']}: tokens the server never produced"
            # Samples of one prompt can get the same short reply (one EOS token, say) with other logprobs:
            # each trajectory must match one served reply, and each reply serves one trajectory.
            logprobs = [m["logprobs"] for m in matches]
            assert traj["logprobs"][n:] in logprobs
            matches.pop(logprobs.index(traj["logprobs"][n:]))
            assert traj["loss_mask"] == [0] * n + [1] * len(output)
            checked += 1
    assert checked == expected


def server_fixtures(subprocess_class: Any) -> tuple[Any, Any]:
    """A server plugin's conftest fixtures: ``server_subprocess`` (``start(*args, port=None)`` runs a
    ``subprocess_class(tmp_path, *args, port=port)``, every one killed at the end of the test) and the autouse
    ``no_leftover_servers`` (a test that leaves a launched server running fails)::

        server_subprocess, no_leftover_servers = server_fixtures(ServerSubprocess)
    """
    import pytest

    @pytest.fixture
    def server_subprocess(tmp_path: Path) -> Any:
        started: list[Any] = []

        def start(*args: str, port: int | None = None) -> Any:
            proc = subprocess_class(tmp_path, *args, port=port).start()
            started.append(proc)
            return proc

        yield start
        for proc in started:
            proc.kill()

    @pytest.fixture(autouse=True)
    def no_leftover_servers() -> Any:
        from scaffold_remote.launcher import live_servers

        yield
        left = live_servers()
        for server in left:
            server.stop(timeout=2.0)
        assert not left, f"servers left running after the test: {[s.url for s in left]}"

    return server_subprocess, no_leftover_servers


def serve_engine_in_process(server: FakeServer, make_engine: Callable[[str], Any], *,
                            timeout: float = 60.0) -> Any:
    """For a class-scoped fixture: serve ``server`` in process on a background loop, start
    ``make_engine(url)`` and yield it as a :class:`~scaffold_testkit.live.LiveEngine`; all stopped after."""
    from .live import BackgroundLoop, LiveEngine

    loop = BackgroundLoop()
    serving = running(server)
    try:
        url = loop.run(serving.__aenter__(), 30)
        engine = make_engine(url)
        try:
            loop.run(engine.start(), timeout)
            yield LiveEngine(engine, loop, timeout=timeout)
        finally:
            loop.run(engine.close(), 30)
    finally:
        try:
            loop.run(serving.__aexit__(None, None, None), 30)
        finally:
            loop.close()


def arith_rows(n: int) -> list[dict[str, Any]]:
    """``n`` rows of a small arithmetic task: ``{"id", "question", "answer"}``."""
    return [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]


def run_rollout(plugin: Any, engine: dict[str, Any], out: Path, n: int, *, sampling: dict[str, Any] | None = None,
                **rollout: Any) -> dict[str, Any]:
    """A rollout (the code path of ``scaffold run``) of :func:`arith_rows` on ``plugin``'s engine (``engine``:
    the config's ``engine`` section), exact-match scored, written to ``out``; its metrics."""
    from scaffold_core.config import load_config
    from scaffold_core.plugins.markers import hookimpl
    from scaffold_core.run.rollout import Rollout

    from .helpers import ListTask, plugin_set

    class TaskPlugin:
        @hookimpl
        def register_tasks(self, registry: Any) -> None:
            registry.add("arith", ListTask)

    plugins = plugin_set(plugin, TaskPlugin())
    config = load_config(data={
        "task": {"name": "arith", "rows": arith_rows(n)}, "engine": engine, "verifier": {"name": "exact_match"},
        "sampling": sampling or {"max_tokens": 12, "temperature": 1.0}, "rollout": {"progress": False, **rollout},
        "output": {"dir": str(out)},
    }, registry=plugins.registry)
    return Rollout(config, output_dir=out, plugins=plugins).run()


def start_failure(engine: Any) -> tuple[Any, float]:
    """The :class:`~scaffold_remote.launcher.LaunchError` ``engine.start()`` raises, and how long it took."""
    import pytest
    from scaffold_remote.launcher import LaunchError

    async def main() -> tuple[Any, float]:
        started = time.monotonic()
        with pytest.raises(LaunchError) as info:
            await engine.start()
        return info.value, time.monotonic() - started

    return run(main())
