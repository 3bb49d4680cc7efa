"""A teacher on the embedded transformers stack: another checkpoint, teacher-forced in padded batches.

``TransformersTeacher(model=...)`` loads any model the embedded engine loads (a local folder, a
``.gguf`` file, a hub id, or the bundled default) and scores each ``(prompt_ids, completion_ids)``
pair with one forward pass over ``prompt + completion`` (right-padded batches of ``max_batch_size``
rows): the logprob of completion token ``j`` is ``log_softmax(logits[len(prompt) - 1 + j])`` at
temperature 1, the same teacher-forced logprobs the engine's fidelity tests compare against.

A float32 Llama-architecture model loaded on CPU has its linear weights rounded to float16, as the
embedded engine rounds a model it loads (``float16_weights``, ``packed_weights.py``), so a teacher of the
student's own file scores exactly what the student sampled from (zero advantage);
``float16_weights: false`` keeps them as loaded, which is what a trainer whose student is its own policy
asks for (scaffold-trl does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from scaffold_core.engines.model_loading import load_model_and_tokenizer, require_torch, resolve_model
from scaffold_core.teacher import Teacher, TeacherScores

from .lean_llama import lean_unsupported
from .packed_weights import model_half_unsupported, round_to_half


class TransformersTeacher(Teacher):
    """Teacher-forced logprobs of another checkpoint, in process (CPU or GPU)."""

    def __init__(self, model: str | None = None, dtype: str = "float32", device: str = "auto",
                 max_batch_size: int = 16, top_k: int = 0, threads: int | None = None,
                 cache_converted: bool = True, trust_remote_code: bool = False,
                 float16_weights: bool | None = None):
        super().__init__()
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no alternatives), got {top_k}")
        self.model_name = model
        self.dtype = dtype
        self.device = device
        self.max_batch_size = max_batch_size
        self.top_k = top_k
        self.threads = threads
        self.cache_converted = cache_converted
        self.trust_remote_code = trust_remote_code
        self.float16_weights = float16_weights  # null: as the engine does (a float32 model on CPU, rounded)
        self.float16_unsupported: str | None = None  # why a model asked to be rounded was not
        self.model: Any = None

    @classmethod
    def wrap(cls, model: Any, tokenizer: Any, **options: Any) -> TransformersTeacher:
        """A teacher scoring with ``model``, an object the caller owns (nothing is loaded or copied)."""
        teacher = cls(**options)
        teacher.model, teacher.tokenizer = model, tokenizer
        return teacher

    async def start(self) -> None:
        if self.model is None:
            await asyncio.to_thread(self._load)

    def _load(self) -> None:
        torch, _ = require_torch()
        if self.threads:
            torch.set_num_threads(self.threads)
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model, self.tokenizer, _ = load_model_and_tokenizer(
            resolve_model(self.model_name), dtype=self.dtype, device=device, use_cache=self.cache_converted,
            trust_remote_code=self.trust_remote_code)
        self.model.eval()
        if self.float16_weights is not False:  # the engine's rule: what its lean forward serves, where it fits
            self.float16_unsupported = lean_unsupported(self.model) or model_half_unsupported(
                torch, self.model, rounds=True)
            if self.float16_unsupported is None:
                round_to_half(torch, self.model)

    async def close(self) -> None:
        self.model = None

    async def _score(self, batch: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TeacherScores]:
        return await asyncio.to_thread(self.score_now, batch)

    def score_now(self, batch: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TeacherScores]:
        """Score ``batch`` on the calling thread (what :meth:`score_batch` runs in a worker thread)."""
        out: list[TeacherScores] = []
        for first in range(0, len(batch), self.max_batch_size):
            out.extend(self._forward(batch[first:first + self.max_batch_size]))
        return out

    def _forward(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TeacherScores]:
        torch, _ = require_torch()
        device = next(self.model.parameters()).device
        seqs = [list(p) + list(c) for p, c in rows]
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, :len(s)] = 1
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        finally:
            self.model.train(was_training)
        scores = []
        for i, (prompt, completion) in enumerate(rows):
            n, m = len(prompt), len(completion)
            if m == 0:
                scores.append(TeacherScores([], [] if self.top_k else None))
                continue
            logp = torch.log_softmax(logits[i, n - 1:n - 1 + m], dim=-1)
            target = torch.tensor(list(completion), dtype=torch.long, device=logp.device)
            chosen = logp.gather(1, target[:, None])[:, 0].tolist()
            top = None
            if self.top_k:
                values, indices = logp.topk(self.top_k, dim=-1)
                top = [dict(zip(ix.tolist(), v.tolist())) for ix, v in zip(indices, values)]
            scores.append(TeacherScores(chosen, top))
        return scores
