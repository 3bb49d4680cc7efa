"""The embedded engine: a Hugging Face causal LM in this process, CPU or GPU.

Continuous batching: requests from concurrent episodes are queued; when the
engine is idle, a batcher on the event loop waits at most ``batch_wait_ms`` for
more to arrive and starts a batch on one worker thread (torch releases the GIL,
so the event loop keeps running). While the batch decodes, requests that arrive
join it between two decode steps (up to ``max_batch_size`` rows): they are
pre-filled and decode alongside the rows already there, so the next turn of a
conversation never waits for other conversations' turns to end. Every sampling
parameter is applied per row, so requests with different parameters share a
batch. A row that finishes is answered at once and dropped from the batch (and
its KV cache), and so is a row whose caller stopped waiting (a cancelled or
timed-out request: counted as ``abandoned``); the KV cache keeps room for the
batch's new tokens, so decode steps write in place (``kv_cache.py``). Joining
needs the lean forward (``lean_llama.py``); through transformers' forward a
request waits for the running batch to end.
Rows of a batch with the same prompt (the samples of one group) share one
prefill: the prompt's KV cache is computed once and copied to each of them
(``prefill.py``; ``share_prefill: false`` turns it off).

Sampling is reproducible per request: each row draws its randomness from its
own generator seeded with the request's seed (Gumbel-max sampling), so a
request samples the same tokens whether it runs alone or in a batch.

Logprobs: for each sampled token, the log-probability under the
temperature-scaled distribution, before top-k/top-p truncation (the same
convention as SGLang, so both engines' trajectories mean the same thing).
With ``logprobs: processed`` they are taken after truncation and
renormalisation instead, i.e. from the exact distribution sampled. Greedy
requests (temperature 0) report the model's untempered log-probabilities.

Top logprobs: a request with ``sampling.top_logprobs = k`` also gets, per
output position, the ``k`` most likely tokens and their logprobs under the
same distribution as the sampled token's logprob.

Constraints: a request whose ``sampling.constraint`` names a grammar (a served
client's forced tool call or JSON output) is decoded under it with xgrammar
(``grammar.py``: the grammar's disallowed tokens are masked before sampling;
the logprobs are those of the masked, renormalised distribution).

Live weights: :meth:`TransformersEngine.wrap` serves a model object the
caller owns (a trainer's policy; nothing is copied), and
:meth:`TransformersEngine.update_weights` loads a state dict or a checkpoint
directory into the served model, or records that the owner changed it in
place. Updates run on the engine's worker thread, between two decode steps
when a batch is decoding: its rows go on from the tokens they have, on the
new weights (their KV cache recomputed), and every result reports the
version of each of its tokens.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import gc
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from annotated_types import Ge

from scaffold_core.distributed.env import usable_cores
from scaffold_core.engine import Engine
from scaffold_core.engines.decode_rows import DecodeRow, new_row, record_top, result_of, take_token
from scaffold_core.engines.model_loading import load_model_and_tokenizer, require_torch, resolve_model
from scaffold_core.engines.sampler import sample, top_logprobs
from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.plugins import Help
from scaffold_core.spans import clock
from scaffold_core.tokenizers import eos_token_ids

from .core_share import CoreShare
from .generic_batch import GenericBatch
from .grammar import Grammars, RowGrammar, available_kinds, mask_logits
from .lean_llama import LeanBatch, LeanLlama, PrefillCounts, has_hooks, lean_unsupported, prefill_order
from .packed_weights import round_to_half
from .prefix_store import PrefixStore
from .preload import Preload, preload_path


@dataclass(eq=False)
class _Pending:
    request: GenerationRequest
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    grammar: RowGrammar | None = None
    queued_at: float = 0.0  # when the request reached the engine (spans.clock)


def _mark(rows: list[DecodeRow], phase: str, began: float) -> None:
    """A span from ``began`` to now on each row; their decoding (re)starts now."""
    now = clock()
    for row in rows:
        row.spans.append((phase, began, now))
        row.decode_from = now


def _end_decode(rows: list[DecodeRow], now: float) -> None:
    """Close each row's current stretch of decoding at ``now``."""
    for row in rows:
        row.spans.append(("decode", row.decode_from, now))


#: Objects made during the engine's load from which one collection follows it (importing torch and transformers
#: makes about 650,000).
COLLECT_AFTER = 100_000


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (the engine's load), one collection after it.

    Importing torch and transformers creates about 650,000 objects, and the collector, on, walks them again
    and again as they come: the imports took 2.7 s with it and 2.0-2.1 s without. One collection at the end
    (0.3 s) leaves the objects that live on in the oldest generation, which later collections seldom walk.
    A collector someone else turned off stays off; one turned off here is turned on again, however the block
    ends. A load that made few objects (torch and transformers imported already, a wrapped model) is left to
    the collector's usual rounds: a full collection then costs more than it saves."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        if gc.get_count()[0] >= COLLECT_AFTER:
            gc.collect()


def auto_device(cuda: bool, gpus: int, local_rank: int = 0) -> str:
    """``device: auto``: worker ``local_rank`` on a machine with ``gpus`` GPUs uses GPU ``local_rank % gpus``."""
    if not cuda or gpus < 1:
        return "cpu"
    return f"cuda:{local_rank % gpus}"


class TransformersEngine(Engine):
    """In-process Hugging Face transformers engine with dynamic batching."""

    def __init__(
        self,
        model: Annotated[str | None, Help("Hugging Face id, local directory or .gguf file (default: the bundled "
                                          "SmolLM2-135M-Instruct)")] = None,
        dtype: Annotated[Literal["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"],
                         Help("the weights' and activations' dtype")] = "float32",
        device: Annotated[str, Help("cuda when available, else cpu (auto), or a torch device")] = "auto",
        max_batch_size: Annotated[int, Ge(1), Help("requests decoded together")] = 32,
        batch_wait_ms: Annotated[float, Ge(0), Help("how long an idle engine waits for more requests")] = 5.0,
        logprobs: Annotated[Literal["temperature", "processed"],
                            Help("logprobs after temperature only, or after top-k/top-p too")] = "temperature",
        threads: Annotated[int, Ge(0), Help("torch CPU threads (null or 0: one per core while nothing else "
                                            "wants one, else one fewer)")] | None = None,
        cache_converted: Annotated[bool, Help("cache GGUF conversions")] = True,
        trust_remote_code: bool = False,
        share_prefill: Annotated[bool, Help("one prefill for requests with the same prompt")] = True,
        lean_forward: Annotated[bool, Help("the lean forward for Llama-architecture models")] = True,
        prefix_cache_mb: Annotated[float, Ge(0), Help("memory for reusable keys and values (0: off)")] = 512,
        pack_weights: Annotated[bool | None, Help("multiply by packed copies of the weights on CPU (null: yes, "
                                                  "except for a wrapped model)")] = None,
        float16_weights: Annotated[bool | None, Help(
            "packed copies in float16, products in float32: half the bytes read a token (null: yes for a float32 "
            "model the engine loads, whose weights are then rounded to float16)")] = None,
    ):
        self.model_name = model
        self.source = resolve_model(model)
        self.dtype = dtype
        self.device_option = device
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.logprobs_mode = logprobs
        self.threads = threads
        self.cache_converted = cache_converted
        self.trust_remote_code = trust_remote_code
        self.share_prefill = share_prefill
        self.lean_forward = lean_forward
        self.prefix_cache_mb = prefix_cache_mb
        self.pack_weights = pack_weights
        self.float16_weights = float16_weights
        self._lean: LeanLlama | None = None  # the lean forward, when the model's architecture has one
        self._cores: CoreShare | None = None  # the thread count, when it follows the machine's load
        self._prefixes: PrefixStore | None = None
        self.lean_unsupported: str | None = None  # why transformers' forward serves the model instead
        # Decode into a KV cache with room reserved (kv_cache.py); False: transformers' growing DynamicCache.
        self.reserve_cache = True
        self.model: Any = None
        self.tokenizer: Any = None
        self.load_info: dict[str, Any] = {}
        self.weight_version = 0
        self._inbox: collections.deque[_Pending] = collections.deque()  # requests not yet in a batch
        self._wake: asyncio.Event | None = None  # set when a request arrives
        self._batcher: asyncio.Task | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closing = threading.Event()
        # batches: started on an idle engine; joined: rows that joined a running batch; rows_stepped: the
        # rows of every decode step (mean_batch = rows_stepped / decode_steps)
        self._stats = {"batches": 0, "rows": 0, "joined": 0, "max_batch": 0, "decode_steps": 0,
                       "rows_stepped": 0, "abandoned": 0}
        #: Tokens decoded so far, counted as each decode step samples them (the run's live progress reads it).
        self.decoded_tokens: int = 0
        self._prefill_stats = {"prefills": 0, "shared_prefills": 0, "prefill_rows_saved": 0,
                               "prefix_tokens_reused": 0, "prefill_s": 0.0}
        self._lent: tuple[Any, Any] | None = None  # (model, tokenizer) the caller owns: see wrap()
        # (source, version, done) of the weight updates waiting for the worker thread
        self._updates: collections.deque[tuple[Any, int, concurrent.futures.Future]] = collections.deque()
        self._updates_lock = threading.Lock()
        self._grammars: Grammars | None = None

    @property
    def constraints(self) -> frozenset[str]:  # type: ignore[override]
        """Every constraint kind, when xgrammar is installed (grammar-constrained decoding, ``grammar.py``)."""
        return available_kinds()

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        if self.model is not None:
            return
        loop = asyncio.get_running_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="scaffold-engine")
        await loop.run_in_executor(self._executor, self._load)
        self._wake = asyncio.Event()
        self._batcher = asyncio.ensure_future(self._batch_loop())

    def _start_preload(self) -> Preload | None:
        """Round and pack the weights on a spare core while transformers is imported (``preload.py``): for a
        float32 model loaded from a local safetensors file onto the CPU, for the lean forward's float16 copies.
        Its torch threads are as many as the engine's first forward gets (torch's threads take the count set when
        they first run an op)."""
        cores = usable_cores()
        if (self._lent is not None or not self.lean_forward or self.dtype not in ("float32", "fp32")
                or self.pack_weights is False or self.float16_weights is False or cores < 2
                or self.device_option not in ("auto", "cpu")
                or (self.source.gguf_file is not None and not self.cache_converted)):
            return None
        source, auto = self.source, self.device_option == "auto"

        def find() -> Path | None:
            import torch

            if auto and torch.cuda.is_available():
                return None
            return preload_path(source)

        return Preload(find, threads=self.threads or CoreShare.least_of(cores))

    def _load(self) -> None:
        with collector_paused():
            preload = self._start_preload()
            try:
                self._load_model(preload)
            finally:
                if preload is not None:
                    preload.cancel()

    def _load_model(self, preload: Preload | None) -> None:
        torch, _ = require_torch()
        device = self.device_option
        if device == "auto":
            local_rank = self.run_info.local_rank if self.run_info is not None else 0
            device = auto_device(torch.cuda.is_available(), torch.cuda.device_count(), local_rank)
        self.device = device
        # not told how many threads, a CPU engine of its own model runs on one core fewer than the process may use
        # (core_share.py); where the lean forward's float16 products run (set below), the count then follows the
        # load, the first look at the machine spanning the model's load
        cores: CoreShare | None = None
        if not self.threads and self._lent is None and device == "cpu":
            cores = CoreShare(torch, usable_cores())
            cores.start()
        elif self.threads:
            torch.set_num_threads(self.threads)
        if self._lent is not None:
            self.model, self.tokenizer = self._lent
            self.device = str(next(self.model.parameters()).device)
            self.load_info = {"source": "wrapped model", "cached": False}
        else:
            self.model, self.tokenizer, self.load_info = load_model_and_tokenizer(
                self.source, dtype=self.dtype, device=device, use_cache=self.cache_converted,
                trust_remote_code=self.trust_remote_code,
            )
        self.context_length = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None
        eos = eos_token_ids(self.tokenizer)
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            eos.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            eos.update(gen_eos)
        self.eos_ids = eos
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (min(eos) if eos else 0)
        self._torch = torch
        import inspect

        # transformers >= 5.2x renamed the KV-cache argument of forward(); support both.
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.lean_unsupported = lean_unsupported(self.model) if self.lean_forward else "lean_forward: false"
        if self.lean_unsupported is None:
            owned = self._lent is None
            pack = self.pack_weights if self.pack_weights is not None else owned
            half = self.float16_weights if self.float16_weights is not None else owned
            self._lean = LeanLlama(torch, self.model, pack=pack, half=half, rounds=owned)
            # the weights rounded and packed while transformers was imported
            preloaded = bool(owned and self._lean.half and preload is not None
                             and preload.apply(torch, self.model, self._lean))
            self.load_info["preloaded"] = preloaded
            if not preloaded:
                self._round_owned_weights()
            if self._lean.half:  # its products give the same bits on any thread count
                self._cores = cores
            if self.prefix_cache_mb > 0:
                self._prefixes = PrefixStore(int(self.prefix_cache_mb * 2**20))

    def _round_owned_weights(self, in_place: bool = False) -> None:
        """Round a model the engine owns to what its float16 copies hold, so that the model's own forward (a
        teacher-forced pass) gives the logprobs the engine samples with. A wrapped model is its owner's: not
        rounded (its logprobs are then within float16's rounding of the owner's forward)."""
        if self._lent is None and self._lean is not None and self._lean.half:
            round_to_half(self._torch, self.model, in_place)

    async def close(self) -> None:
        self._closing.set()
        if self._batcher is not None:
            self._batcher.cancel()
            try:
                await self._batcher
            except (asyncio.CancelledError, Exception):
                pass
            self._batcher = None
        if self._executor is not None:  # a batch decoding stops after its step (and fails its rows)
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        while self._inbox:
            pending = self._inbox.popleft()
            if not pending.future.done():
                pending.future.set_exception(EngineError("engine closed before the request ran"))
        with self._updates_lock:
            left, self._updates = list(self._updates), collections.deque()
        for _, _, done in left:
            done.set_exception(EngineError("engine closed before the weight update ran", retryable=False))

    # -- live weights -----------------------------------------------------
    @classmethod
    def wrap(cls, model: Any, tokenizer: Any, **options: Any) -> TransformersEngine:
        """An engine serving ``model``, an object the caller owns (e.g. a trainer's policy).

        Nothing is copied or moved: the engine decodes with ``model`` as it is
        (its device and dtype) and sees every change the owner makes to its
        weights. ``start()`` loads nothing; ``close()`` leaves the model alone.
        Its mode is left as the owner set it: the lean forward has no dropout,
        and transformers' forward (other architectures) runs each pass with
        the model's submodules in eval mode, the model's own flag untouched
        (see :meth:`_forward`). The owner
        should not step its optimizer while requests run. ``options`` are the engine's other
        options (``max_batch_size``, ``batch_wait_ms``, ``logprobs``,
        ``threads``). A wrapped model's weights are not packed (``packed_weights.py``)
        unless ``pack_weights=True``: torch does not count a change made through
        ``param.data``, and a packed copy would miss it until the next ``update_weights``.
        """
        for name in ("model", "dtype", "device", "cache_converted", "trust_remote_code"):
            if name in options:
                raise ValueError(f"{name!r} does not apply to a wrapped model")
        engine = cls(**options)
        engine._lent = (model, tokenizer)
        return engine

    async def update_weights(self, source: Any = None, *, version: int | None = None) -> int:
        """Serve new weights; return the new ``weight_version`` (see :meth:`Engine.update_weights`).

        ``source``: a state dict (name -> tensor) or a checkpoint directory
        (``save_pretrained`` output), copied into the served model; or
        ``None`` when the owner of a wrapped model changed its weights in
        place (only the version moves). The update runs on the engine's worker
        thread: at once when no batch is decoding, else after the decode step
        in progress. The batch's rows then go on from the tokens they have on
        the new weights (their KV cache recomputed), so a result can hold
        tokens of both versions; its ``versions`` says which is which.
        """
        if self._executor is None or self.model is None:
            raise EngineError("the transformers engine is not started: await engine.start() first", retryable=False)
        new_version = self.next_weight_version(version)
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._updates_lock:
            self._updates.append((source, new_version, done))
        self._executor.submit(self._apply_updates)  # a decode loop in progress may apply it first
        await asyncio.wrap_future(done)
        return new_version

    def _apply_updates(self) -> bool:
        """Apply the weight updates waiting, in order (worker thread only); True when the weights changed."""
        changed = False
        while True:
            with self._updates_lock:
                if not self._updates:
                    return changed
                source, version, done = self._updates.popleft()
            try:
                if source is not None:
                    from .weights import load_weights

                    load_weights(self.model, source)
            except Exception as exc:  # refused before anything was copied: the old weights stay
                done.set_exception(exc)
                continue
            self.weight_version = version
            self._stats["weight_updates"] = self._stats.get("weight_updates", 0) + 1
            if self._prefixes is not None:  # keys and values of the old weights
                self._prefixes.clear()
            if self._lean is not None and self._lean.packed is not None:  # copies of the old weights
                self._lean.packed.clear()
            self._round_owned_weights(in_place=True)  # the update was copied into the weights' own storage
            changed = True
            done.set_result(version)

    def _forward(self, batch: Any, method: str, *args: Any) -> Any:
        """``batch.start()`` or ``batch.step(tokens)``, without dropout whatever the model's mode.

        The lean forward has no dropout and reads no mode: a wrapped model (a trainer's policy, in train mode)
        keeps the mode its owner gave it all along, even while other requests decode. transformers' forward
        drops out where a module is in train mode, so for that one pass the model's submodules in train mode
        are put in eval mode and back after it. The model itself is never touched: an owner that reads its
        ``training`` flag while other requests decode on the worker thread (a trainer whose rollouts are in,
        telling a training step from an evaluation) always finds the mode it set.
        """
        call = getattr(batch, method)
        lean = isinstance(batch, LeanBatch)
        if lean and self._cores is not None and method == "step":  # decode steps are timed (core_share.py)
            self._cores.step_threads()
            began = clock()
            logits = call(*args)
            self._cores.timed(len(args[0]), clock() - began)
            return logits
        if self._cores is not None:
            self._cores.adjust(lean)
        if lean:
            return call(*args)
        training = [m for m in self.model.modules() if m.training and m is not self.model]
        for module in training:
            module.training = False
        try:
            return call(*args)
        finally:
            for module in training:
                module.training = True

    def stats(self) -> dict[str, Any]:
        s: dict[str, Any] = dict(self._stats)
        s["mean_batch"] = round(s["rows_stepped"] / s["decode_steps"], 2) if s["decode_steps"] else 0.0
        s.update(self._prefill_stats, prefill_s=round(self._prefill_stats["prefill_s"], 3))
        s.update({k: v for k, v in self.load_info.items() if k in ("source", "cached", "preloaded")})
        if self._cores is not None:
            s["threads"] = self._cores.threads  # now (all cores while nothing else wants one: core_share.py)
            s["thread_changes"] = self._cores.changes
        packed = self._lean.packed if self._lean is not None else None
        s["weight_packs"] = packed.packs if packed is not None else 0  # packed copies made (packed_weights.py)
        if self._lean is not None and self._lean.pack_unsupported is not None:
            s["pack_unsupported"] = self._lean.pack_unsupported  # why the weights are read as they are
        elif self._lean is not None:
            s["packed_dtype"] = "float16" if self._lean.half else str(self._lean.model.dtype).removeprefix("torch.")
            if self._lean.half_unsupported is not None:
                s["float16_unsupported"] = self._lean.half_unsupported  # why the copies keep the model's dtype
        return s

    # -- requests ---------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self._wake is None:
            raise EngineError("the transformers engine is not started: await engine.start() first")
        n_prompt = len(request.prompt_ids)
        if n_prompt == 0:
            raise EngineError("empty prompt: a request needs at least one prompt token", retryable=False)
        if self.context_length and n_prompt >= self.context_length:
            raise EngineError(
                f"prompt has {n_prompt} tokens but the model's context is {self.context_length} tokens; "
                "shorten the prompt (fewer few-shot examples, a shorter system prompt)", retryable=False)
        loop = asyncio.get_running_loop()
        pending = _Pending(request, loop.create_future(), loop, self._grammar(request), clock())
        self._inbox.append(pending)
        self._wake.set()
        return await pending.future

    def _grammar(self, request: GenerationRequest) -> RowGrammar | None:
        """The request's constraint, compiled (an EngineError naming the problem when it cannot be)."""
        constraint = request.sampling.constraint
        if constraint is None:
            return None
        if self._grammars is None:
            width = self.model.get_output_embeddings().weight.shape[0]
            self._grammars = Grammars(self.tokenizer, width, self.eos_ids)
        return self._grammars.row(constraint)

    async def _batch_loop(self) -> None:
        """Start a batch on the worker thread when requests wait and the engine is idle."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._inbox:
                continue  # a running batch took them
            deadline = loop.time() + self.batch_wait_s
            while len(self._inbox) < self.max_batch_size:  # a moment for the requests sent together
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            await loop.run_in_executor(self._executor, self._serve)

    # -- the decode loop (worker thread) ------------------------------------
    def _make_row(self, pending: _Pending) -> DecodeRow:
        return new_row(self._torch, pending.request, pending.future, eos_ids=self.eos_ids,
                       context_length=self.context_length,
                       grammar=pending.grammar, loop=pending.loop)

    def _take(self, room: int) -> list[DecodeRow]:
        """Up to ``room`` waiting requests whose callers still wait, as rows."""
        rows: list[DecodeRow] = []
        while self._inbox and len(rows) < room:
            pending = self._inbox.popleft()
            if not pending.future.done():  # timed-out callers are gone
                row = self._make_row(pending)
                row.spans.append(("queued", pending.queued_at, clock()))
                rows.append(row)
        return rows

    @staticmethod
    def _answer(row: DecodeRow, outcome: Any) -> None:
        """Give a row's caller its result (or error), on the caller's event loop."""
        future = row.future

        def settle() -> None:
            if future.done():
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
            row.loop.call_soon_threadsafe(settle)

    def _serve(self) -> None:
        """Decode until no row is left and no request waits; every row's caller gets an answer."""
        rows: list[DecodeRow] = []  # the rows decoding, kept current by _decode
        try:
            with self._torch.inference_mode():
                self._decode(rows)
        except BaseException as exc:
            error = EngineError(f"generation failed: {type(exc).__name__}: {exc}")
            for row in rows:
                self._answer(row, error)
            return
        finally:
            if self._cores is not None:
                self._cores.rest()
        for row in rows:  # still decoding when the engine closed
            self._answer(row, EngineError("engine closed while the request was running"))

    def _new_batch(self, rows: list[DecodeRow]) -> Any:
        """The decode state of ``rows`` (each one's prompt and the tokens it has so far), not yet pre-filled."""
        prompts = [r.request.prompt_ids + r.output_ids for r in rows]
        reserve = max(r.max_new - len(r.output_ids) for r in rows)
        if self._lean is not None and not has_hooks(self._torch, self.model):
            return LeanBatch(self._lean, prompts, reserve=reserve, share=self.share_prefill, store=self._prefixes,
                             version=self.weight_version)
        return GenericBatch(self._torch, self.model, prompts, pad_id=self.pad_id, cache_arg=self._cache_arg,
                            share=self.share_prefill, reserve=reserve if self.reserve_cache else 0)

    def _admit(self, rows: list[DecodeRow], batch: Any, logits: Any) -> tuple[Any, Any]:
        """Waiting requests into the batch (a new one when ``rows`` is empty): (batch, logits of every row)."""
        joinable = not rows or isinstance(batch, LeanBatch)  # transformers' forward: wait for the batch's end
        room = self.max_batch_size - len(rows)
        if not joinable or room <= 0 or not self._inbox:
            return batch, logits
        new = self._take(room)
        if not new:
            return batch, logits
        if self._lean is not None:  # prompts of similar length side by side (grouped prefill)
            new.sort(key=lambda r: prefill_order(r.request.prompt_ids))
        old = list(rows)
        rows.extend(new)  # from now on an error answers them too
        began = clock()
        fresh = self._new_batch(new)
        fresh_logits = self._forward(fresh, "start")
        _mark(new, "prefill", began)
        self._count_prefill(fresh.counts)
        self._stats["rows"] += len(new)
        if old and isinstance(fresh, LeanBatch):
            batch.absorb(fresh)
            logits = self._torch.cat([logits, fresh_logits])
            self._stats["joined"] += len(new)
        elif old:  # hooks came in while the batch decoded: its rows go on through transformers' forward
            began = clock()
            _end_decode(old, began)
            batch = self._new_batch(rows)
            logits = self._forward(batch, "start")
            _mark(old, "prefill", began)
            self._count_prefill(batch.counts)
        else:
            batch, logits = fresh, fresh_logits
            self._stats["batches"] += 1
        self._stats["max_batch"] = max(self._stats["max_batch"], len(rows))
        return batch, logits

    def _decode(self, rows: list[DecodeRow]) -> None:
        """The decode loop: ``rows`` (empty at first) holds the rows decoding, requests join between steps."""
        self._apply_updates()  # those that came in while the batch formed
        batch: Any = None
        logits: Any = None
        while not self._closing.is_set():
            if not rows and self._updates:
                self._apply_updates()
            batch, logits = self._admit(rows, batch, logits)
            if not rows:
                return
            version = self.weight_version
            self._stats["decode_steps"] += 1
            self._stats["rows_stepped"] += len(rows)
            self.decoded_tokens += len(rows)
            if any(r.grammar is not None for r in rows):  # constrained rows: disallowed tokens out before anything
                mask_logits([r.grammar for r in rows], logits)
            tokens, logprobs, report = sample(self._torch, logits, [r.request.sampling for r in rows],
                                              [r.generator for r in rows],
                                              processed=self.logprobs_mode == "processed")
            self._record_top(rows, report)
            still: list[int] = []
            done: list[int] = []
            for slot, (token, logprob) in enumerate(zip(tokens, logprobs)):
                if take_token(rows[slot], token, logprob, version, self.tokenizer):
                    done.append(slot)
                    self._stats["abandoned"] += rows[slot].finish == "abort"
                else:
                    still.append(slot)
            if done:
                _end_decode([rows[slot] for slot in done], clock())
            self._keep_prefixes(batch, rows, done)
            for slot in done:  # answered now: a conversation's next turn can join this batch
                self._answer(rows[slot], result_of(rows[slot], self.tokenizer))
            if done:
                rows[:] = [rows[s] for s in still]
                if not rows:
                    batch = logits = None
                    continue
                batch.drop(done)
            if self._closing.is_set():
                return
            if self._updates:
                paused = clock()
                if self._apply_updates():  # new weights: the rows go on from what they have
                    _end_decode(rows, paused)
                    _mark(rows, "weight_wait", paused)
                    began = clock()
                    batch = self._new_batch(rows)
                    logits = self._forward(batch, "start")
                    _mark(rows, "prefill", began)
                    self._count_prefill(batch.counts)
                    continue
            logits = self._forward(batch, "step", [r.output_ids[-1] for r in rows])

    def _keep_prefixes(self, batch: Any, live: list[DecodeRow], done: list[int]) -> None:
        """Store the keys and values of finished rows, for prompts that will extend them (the next turn)."""
        if self._prefixes is None or not isinstance(batch, LeanBatch):
            return
        for slot in done:
            row = live[slot]
            keys, values, length = batch.keys_values(slot)
            tokens = row.request.prompt_ids + row.output_ids[:-1]
            if length == len(tokens):
                self._prefixes.add(tokens, self.weight_version, keys, values)

    def _count_prefill(self, counts: PrefillCounts) -> None:
        """``prefills``: prompts pre-filled; ``shared_prefills``: those that served several rows of one group;
        ``prefix_tokens_reused``: prompt tokens whose keys and values came from an earlier sequence."""
        stats = self._prefill_stats
        stats["prefills"] += counts.prompts
        stats["shared_prefills"] += counts.shared
        stats["prefill_rows_saved"] += counts.rows_saved
        stats["prefix_tokens_reused"] += counts.reused_tokens
        stats["prefill_s"] += counts.seconds

    def _record_top(self, rows: list[DecodeRow], report: Any) -> None:
        """Append each asking row's top-k ``{token: logprob}`` of this step (one topk for the whole batch)."""
        ks = [r.request.sampling.top_logprobs if r.top is not None else 0 for r in rows]
        if any(ks):
            record_top(rows, top_logprobs(self._torch, report, ks))
