"""The ``llamacpp`` engine: llama.cpp in this process, on any GGUF file, with batching across episodes.

For what does not train: ``scaffold run``, ``eval``, ``serve``, a teacher or
judge model. Prompts are token ids; results are the sampled ids, their
logprobs and the same finish reasons as the embedded engine. llama.cpp's own
server answers one request at a time, so this engine drives its low-level
batch API instead: a worker thread keeps up to ``max_batch_size`` sequences
in one context (continuous batching: a request joins at the next step, a
finished one leaves at once), each llama.cpp ``decode`` call carries the new
prompts' tokens and one token of every running sequence, and logprobs and
sampling are computed from the logits by the same code as the embedded
engine's (``scaffold_core.engines.sampler``: temperature, top-k, top-p, seeds,
top logprobs, the ``logprobs`` convention).

It cannot take weight updates: the GGUF file is served as it is. Training
uses the embedded ``transformers`` engine.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Annotated, Any, Literal

from annotated_types import Ge

from scaffold_core.engine import Engine
from scaffold_core.errors import EngineError, require_module
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.plugins import Help

INSTALL = 'pip install "scaffold-llamacpp[llama]"  (compiles llama.cpp: several minutes)'


class LlamaCppEngine(Engine):
    """llama.cpp (llama-cpp-python) on a GGUF file; see the module doc."""

    def __init__(self, model: Annotated[str | None, Help("a .gguf file (default: the bundled SmolLM2 GGUF)")] = None,
                 n_ctx: Annotated[int, Ge(16), Help("the context's tokens, shared by the batch")] = 16384,
                 max_batch_size: Annotated[int, Ge(1), Help("sequences decoded together")] = 32,
                 n_batch: Annotated[int, Ge(1), Help("tokens per llama.cpp decode call")] = 512,
                 batch_invariant: Annotated[bool, Help(
                     "each sequence in KV cells of its own (n_ctx split evenly among max_batch_size + 1 "
                     "sequences): a request gives the same tokens and logprobs alone or batched")] = False,
                 threads: Annotated[int, Ge(1)] | None = None,
                 logprobs: Annotated[Literal["temperature", "processed"],
                                     Help("logprobs after temperature only, or after top-k/top-p too")]
                 = "temperature"):
        from scaffold_core.engines.model_loading import resolve_model

        self.source = resolve_model(model)
        if not self.source.gguf_file:
            raise ValueError(f"engine.model: the llamacpp engine needs a .gguf file, got {model!r}")
        self.n_ctx, self.max_batch_size, self.n_batch = n_ctx, max_batch_size, n_batch
        self.batch_invariant = batch_invariant
        # KV cells one sequence may fill: the whole context (shared), or its even share (see _load)
        self.room = n_ctx // (max_batch_size + 1) if batch_invariant else n_ctx
        self.threads, self.processed = threads, logprobs == "processed"
        self._requests: queue.Queue[tuple[GenerationRequest, asyncio.Future, asyncio.AbstractEventLoop]] = (
            queue.Queue())
        self._closing = threading.Event()
        self._worker: threading.Thread | None = None
        self._llama: Any = None
        self._stats = {"steps": 0, "rows": 0, "max_batch": 0, "prompt_tokens": 0, "abandoned": 0}

    # -- lifecycle ----------------------------------------------------------
    async def start(self) -> None:
        if self._worker is not None:
            return
        await asyncio.get_running_loop().run_in_executor(None, self._load)
        self._worker = threading.Thread(target=self._serve, name="scaffold-llamacpp", daemon=True)
        self._worker.start()

    def _load(self) -> None:
        from pathlib import Path

        llama = require_module("llama_cpp", needed_by="the 'llamacpp' engine", install=INSTALL)
        torch, _ = require_module("torch", "transformers", needed_by="the 'llamacpp' engine",
                                  install='pip install "scaffold-core[transformers]"')
        from transformers import AutoTokenizer

        from scaffold_core.engines.model_loading import cached_model_dir
        from scaffold_core.tokenizers import eos_token_ids

        path = Path(self.source.location) / (self.source.gguf_file or "")
        converted = cached_model_dir(self.source)  # the embedded engine's conversion, when one exists
        if converted is not None:
            self.tokenizer = AutoTokenizer.from_pretrained(str(converted))
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(self.source.location, gguf_file=self.source.gguf_file)
        import logging

        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's load chatter, not its errors
        llama.llama_backend_init()
        mparams = llama.llama_model_default_params()
        model = llama.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise EngineError(f"llama.cpp could not load {path}", retryable=False)
        cparams = llama.llama_context_default_params()
        n_batch = max(2, self.n_batch)  # a lone token may be decoded with a padding token (see _decode)
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = self.n_ctx, n_batch, n_batch
        cparams.n_seq_max = self.max_batch_size + 1  # and the padding's sequence (see _decode)
        # Shared cells (the default): n_ctx is the batch's total. A sequence's cells then lie among the others',
        # where they fall, and the attention's sums over them round differently than alone: with quantized
        # activations a logprob drifts by a few hundredths of a nat over a few tokens, sometimes a greedy token
        # changes (measured). batch_invariant gives each sequence cells of its own, laid out as when alone:
        # then equal bit for bit (measured), for n_ctx split evenly.
        cparams.kv_unified = not self.batch_invariant
        cparams.no_perf = True
        if self.threads:
            cparams.n_threads = cparams.n_threads_batch = self.threads
        ctx = llama.llama_init_from_model(model, cparams)
        if not ctx:
            llama.llama_model_free(model)
            raise EngineError(f"llama.cpp could not create a context of {self.n_ctx} tokens", retryable=False)
        self._llama, self._torch, self._model, self._ctx = llama, torch, model, ctx
        self._memory = llama.llama_get_memory(ctx)
        self._vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
        self._batch = llama.llama_batch_init(n_batch, 0, 1)
        self.context_length = int(llama.llama_model_n_ctx_train(model)) or None
        self.eos_ids = eos_token_ids(self.tokenizer)

    async def close(self) -> None:
        self._closing.set()
        if self._worker is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._worker.join, 60)
            self._worker = None
        while not self._requests.empty():
            _, future, loop = self._requests.get_nowait()
            loop.call_soon_threadsafe(_fail, future, EngineError("engine closed before the request ran"))
        if self._llama is not None:
            llama, self._llama = self._llama, None
            llama.llama_batch_free(self._batch)
            llama.llama_free(self._ctx)
            llama.llama_model_free(self._model)

    async def update_weights(self, source: Any = None, *, version: int | None = None) -> int:
        raise EngineError("the llamacpp engine serves its GGUF file as it is and cannot take weight updates; "
                          "train with the embedded 'transformers' engine", retryable=False)

    def stats(self) -> dict[str, Any]:
        s: dict[str, Any] = dict(self._stats)
        s["mean_batch"] = round(s["rows_stepped"] / s["steps"], 2) if s.get("steps") else 0.0
        s.pop("rows_stepped", None)
        return s

    # -- requests -------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self._worker is None:
            raise EngineError("the llamacpp engine is not started: await engine.start() first")
        n = len(request.prompt_ids)
        if n == 0:
            raise EngineError("empty prompt: a request needs at least one prompt token", retryable=False)
        if self.context_length and n >= self.context_length:
            raise EngineError(f"prompt has {n} tokens but the model's context is {self.context_length} tokens; "
                              "shorten the prompt", retryable=False)
        if n + 1 > self.n_ctx:
            raise EngineError(f"prompt has {n} tokens but engine.n_ctx is {self.n_ctx}; raise n_ctx",
                              retryable=False)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._requests.put((request, future, loop))
        return await future

    # -- the worker thread ------------------------------------------------------
    def _serve(self) -> None:
        from scaffold_core.engines.decode_rows import new_row

        rows: dict[int, Any] = {}  # sequence id -> (row, loop, prompt length)
        try:
            while not self._closing.is_set():
                new = self._admit(rows, new_row)
                if not rows:
                    continue
                self._step(rows, new)
        except BaseException as exc:  # noqa: BLE001 - every waiting caller hears why
            for row, loop, _ in rows.values():
                loop.call_soon_threadsafe(_fail, row.future, EngineError(f"llama.cpp failed: {exc}"))
            raise

    def _admit(self, rows: dict[int, Any], new_row: Any) -> list[int]:
        """Take waiting requests into free sequences while the context has room; their sequence ids."""
        added: list[int] = []
        used = sum(n + row.max_new for row, _, n in rows.values())
        while len(rows) < self.max_batch_size:
            try:
                request, future, loop = self._requests.get(timeout=0.05) if not rows else self._requests.get_nowait()
            except queue.Empty:
                break
            if future.done():
                continue
            n = len(request.prompt_ids)
            room = min(self.room, self.context_length or self.room)
            if n >= room:
                share = ("the model's context length" if room < self.room else
                         f"its share of n_ctx ({self.n_ctx} / {self.max_batch_size + 1} with batch_invariant)"
                         if self.batch_invariant else f"n_ctx ({self.n_ctx})")
                loop.call_soon_threadsafe(_fail, future, EngineError(
                    f"a prompt of {n} tokens does not fit a sequence's {room} KV cells, {share}: raise "
                    "engine.n_ctx" + (" or lower engine.max_batch_size" if self.batch_invariant else ""),
                    retryable=False))
                continue
            row = new_row(self._torch, request, future, eos_ids=self.eos_ids, context_length=room)
            if not self.batch_invariant and used + n + row.max_new > self.n_ctx and rows:
                # wait for running sequences to free cells
                self._requests.put((request, future, loop))
                break
            seq = next(s for s in range(self.max_batch_size) if s not in rows)
            rows[seq] = (row, loop, n)
            used += n + row.max_new
            added.append(seq)
        return added

    def _step(self, rows: dict[int, Any], new: list[int]) -> None:
        from scaffold_core.engines.decode_rows import record_top, result_of, take_token
        from scaffold_core.engines.sampler import sample, top_logprobs

        torch = self._torch
        entries: list[tuple[int, int, int, bool]] = []  # (token, position, sequence, wants logits)
        for seq, (row, _, n) in rows.items():
            if seq in new:
                ids = row.request.prompt_ids
                entries += [(t, p, seq, p == n - 1) for p, t in enumerate(ids)]
                self._stats["prompt_tokens"] += n
            else:
                entries.append((row.output_ids[-1], n + len(row.output_ids) - 1, seq, True))
        self._stats["rows"] += len(new)
        self._stats["steps"] += 1
        self._stats["rows_stepped"] = self._stats.get("rows_stepped", 0) + len(rows)
        self._stats["max_batch"] = max(self._stats["max_batch"], len(rows))
        order, logits = self._decode(entries)
        live = [rows[seq][0] for seq in order]
        tokens, logprobs, report = sample(torch, torch.from_numpy(logits), [r.request.sampling for r in live],
                                          [r.generator for r in live], processed=self.processed)
        ks = [r.request.sampling.top_logprobs if r.top is not None else 0 for r in live]
        if any(ks):
            record_top(live, top_logprobs(torch, report, ks))
        for seq, token, logprob in zip(order, tokens, logprobs):
            row, loop, _ = rows[seq]
            if take_token(row, token, logprob, 0, self.tokenizer):
                self._stats["abandoned"] += row.finish == "abort"
                self._llama.llama_memory_seq_rm(self._memory, seq, -1, -1)
                del rows[seq]
                loop.call_soon_threadsafe(_resolve, row.future, result_of(row, self.tokenizer))

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> tuple[list[int], Any]:
        """Run the entries through llama.cpp in chunks of ``n_batch``; (sequences, their logits) in order."""
        import numpy as np

        llama, batch = self._llama, self._batch
        wanted = sum(1 for e in entries if e[3])
        out = np.empty((wanted, self._vocab), dtype=np.float32)
        order: list[int] = []
        for start in range(0, len(entries), self.n_batch):
            chunk = entries[start:start + self.n_batch]
            # llama.cpp multiplies one token by another kernel than several (a lone sequence's logprobs moved
            # 0.12 nats in a batch, measured): batch_invariant gives a lone token a padding token beside it, in a
            # sequence of its own cleared at once (it costs: one sequence decodes at about half the speed).
            padded = (chunk + [(chunk[0][0], 0, self.max_batch_size, False)]
                      if len(chunk) == 1 and self.batch_invariant else chunk)
            for i, (token, pos, seq, logits) in enumerate(padded):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, logits
            batch.n_tokens = len(padded)
            code = llama.llama_decode(self._ctx, batch)
            if padded is not chunk:
                llama.llama_memory_seq_rm(self._memory, self.max_batch_size, -1, -1)
            if code != 0:
                raise EngineError(f"llama.cpp decode failed (code {code}): the context is full or the batch "
                                  "too large; raise n_ctx or lower max_batch_size")
            for i, (_, _, seq, logits) in enumerate(chunk):
                if logits:
                    ptr = llama.llama_get_logits_ith(self._ctx, i)
                    out[len(order)] = np.ctypeslib.as_array(ptr, shape=(self._vocab,))
                    order.append(seq)
        return order, out


def _resolve(future: asyncio.Future, result: GenerationResult) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
