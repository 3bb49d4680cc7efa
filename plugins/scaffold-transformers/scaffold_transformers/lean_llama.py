"""A lean forward pass for Llama-architecture models on a preallocated KV cache.

transformers' forward is written for every use (training, many attention
backends, hooks, output records): one decode step of SmolLM2-135M runs about
1,500 small tensor operations and Python calls, and on a laptop CPU that
overhead costs more than the matrix products themselves
(``bench/engine_profile.py`` shows it). This module runs the same arithmetic
(RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) with the
model's own parameter tensors, read at the start of every batch, so a weight
update, or a trainer's in-place change to a wrapped model, is seen by the next
batch. On CPU the linear layers may multiply by packed copies of the weights
(``packed_weights.py``: about twice as fast), each made again when its
parameter changes; q, k and v are then one product, and gate and up another.
Logprobs stay within float rounding of a teacher-forced pass of the model (the
engine's tests check |Δ| ≤ 1e-3).

:class:`LeanBatch` is the decode state of one batch:

* its KV cache is allocated once, for the prompts plus the most tokens any row
  may add, and every decode step writes one column in place;
* prompts are right-aligned (the last column holds every row's newest token);
  they are pre-filled in groups of similar length, so a short prompt never
  pays for a long one's padding; rows with the same prompt (one group's
  samples) share one prefill; a prompt that extends a sequence the engine has
  seen (the next turn of a conversation) starts from that sequence's keys and
  values (``prefix_store.py``) and only its new tokens are pre-filled;
* rows that finish are masked out of the work that scales with the batch
  (the output layer, sampling) at once, and dropped from the cache when enough
  of them have finished to pay for the copy.

Architectures other than those named in :data:`LEAN_MODEL_TYPES` (or with
features this module does not implement) use transformers' forward
(``generic_batch.py``); :func:`lean_unsupported` says why. So does a batch
that starts while forward hooks are registered on the model (a trainer's or a
profiler's instrumentation expects its forward to run).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

from .packed_weights import PackedWeights, linear_weights, model_half_unsupported, packing_unsupported
from .prefix_store import Hit

#: ``config.model_type`` values whose decoder layer is Llama's (Qwen2 adds q/k/v biases, read like any bias).
LEAN_MODEL_TYPES = ("llama", "qwen2")
#: Most tokens (distinct prompts x padded width) pre-filled in one forward pass.
PREFILL_TOKENS = 4096
#: A prompt joins a prefill group when its padding would be at most this share of the group's width.
PREFILL_PADDING = 0.125
#: Distinct prompts of a batch whose common start is at least this long, and this share of the shortest,
#: pre-fill that start once and extend it each (the few-shot examples of a benchmark's prompts).
SHARED_PREFIX_MIN = 16
SHARED_PREFIX_SHARE = 0.5
#: Up to this many activation rows a product is taken as weight @ activations^T (``few_rows_linear``).
FEW_ROWS = 64
#: Up to this many queries a row, attention is written out (``written_attention``), not torch's fused kernel.
WRITTEN_QUERIES = 16


def lean_unsupported(model: Any) -> str | None:
    """Why the lean forward cannot run ``model`` (``None`` when it can)."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or inner is None or getattr(config, "model_type", None) not in LEAN_MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {', '.join(LEAN_MODEL_TYPES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (the lean forward implements silu)"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    if getattr(config, "pretraining_tp", 1) not in (1, None):
        return "pretraining_tp > 1"
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, name):
            return f"the model has no model.{name}"
    if getattr(model, "lm_head", None) is None:
        return "the model has no lm_head"
    return None


def has_hooks(torch: Any, model: Any) -> bool:
    """Whether forward hooks are registered on ``model``'s modules (or globally): its forward must then run."""
    hooks = torch.nn.modules.module
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def attention(torch: Any, q: Any, k: Any, v: Any, mask: Any) -> Any:
    """Grouped-query attention of ``q`` [rows, heads, queries, head_dim] over ``k``/``v`` [rows, kv_heads, keys,
    head_dim]; ``mask`` (boolean, or added to the scores) broadcasts to [rows, 1, queries, keys].

    With few queries a row, torch's fused kernel splits the keys among the threads it has, so its sums, and
    the logprobs, would change with the thread count (which follows the machine's load: ``core_share.py``):
    up to :data:`WRITTEN_QUERIES` queries it is written out, each row's sums the same on any thread count."""
    if q.shape[2] <= WRITTEN_QUERIES:
        return written_attention(torch, q, k, v, mask)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                            enable_gqa=k.shape[1] != q.shape[1])


def written_attention(torch: Any, q: Any, k: Any, v: Any, mask: Any) -> Any:
    """:func:`attention` written out: two products and a softmax."""
    rows, heads, queries, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    # the heads sharing a key head are that head's queries: no copies of the keys
    scores = q.reshape(rows, kv_heads, group * queries, d).matmul(k.transpose(-1, -2)).mul_(1 / math.sqrt(d))
    if mask is not None:
        per_head = scores.view(rows, kv_heads, group, queries, -1)
        if mask.dtype == torch.bool:
            per_head.masked_fill_(~mask[:, :, None], -math.inf)
        else:
            per_head.add_(mask[:, :, None])
    return scores.softmax(-1).matmul(v).view(rows, heads, queries, d)


@dataclass
class PrefillCounts:
    """What a batch's prefill did (the engine's prefill statistics)."""

    prompts: int = 0  # distinct prompts pre-filled
    shared: int = 0  # of those, prompts that served more than one row
    rows_saved: int = 0  # rows that reused another row's prefill
    reused_tokens: int = 0  # prompt tokens whose keys and values came from the prefix store
    seconds: float = 0.0


class LeanLlama:
    """The forward pass of one Llama-architecture model, built from its modules.

    With ``pack`` (and a CPU model of float32 or native bfloat16) the linear layers multiply by packed
    copies of their weights (``packed_weights.py``), each made again when its parameter changes; else
    nothing is copied. With ``half`` too (a float32 model) the copies hold the weights in float16; with
    ``rounds``, the model's linear weights are to be rounded to float16 in storage of their own (its owner
    does it: ``round_to_half``), which the memory they need counts too.
    """

    def __init__(self, torch: Any, model: Any, pack: bool = False, half: bool = False, rounds: bool = False):
        self.torch = torch
        self.F = torch.nn.functional
        self.model = model
        config = model.config
        self.hidden = int(config.hidden_size)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or self.hidden // self.heads)
        self.group = self.heads // self.kv_heads
        self.eps = float(config.rms_norm_eps)
        self.layers = len(model.model.layers)
        self.pack_unsupported: str | None = "pack: false"
        self.half_unsupported: str | None = None  # why float16 copies, asked for, are not made
        if pack:
            weight = model.model.embed_tokens.weight
            count = sum(w.numel() for w in linear_weights(torch, model))
            self.half_unsupported = model_half_unsupported(torch, model, rounds) if half else None
            size = 2 if half and self.half_unsupported is None else weight.element_size()
            self.pack_unsupported = packing_unsupported(torch, weight.dtype, weight.device, count * size)
        if self.pack_unsupported is not None and half:
            self.half_unsupported = "the weights are not packed"
        self.half = half and self.pack_unsupported is None and self.half_unsupported is None
        self.packed = PackedWeights(torch, half=self.half) if self.pack_unsupported is None else None
        self._products_of: Any = None  # the layers whose products' groups are _product_groups
        self._product_groups: list[tuple[tuple[Any, ...], ...]] = []

    def weights(self) -> tuple[Any, list[tuple[Any, ...]], Any, Any]:
        """(embedding, per-layer tensors, final norm, output layer): the model's own parameters, read now."""
        inner = self.model.model
        layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            layers.append((layer.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight,
                           a.k_proj.bias, a.v_proj.weight, a.v_proj.bias, a.o_proj.weight, a.o_proj.bias,
                           layer.post_attention_layernorm.weight, m.gate_proj.weight, m.gate_proj.bias,
                           m.up_proj.weight, m.up_proj.bias, m.down_proj.weight, m.down_proj.bias))
        head = self.model.lm_head
        if self.packed is not None:
            self.packed.keep_only({id(t) for layer in layers for t in layer} | {id(head.weight)})
        return inner.embed_tokens.weight, layers, (inner.norm.weight, inner.norm.variance_epsilon), (
            head.weight, getattr(head, "bias", None))

    def rope(self, x: Any, positions: Any) -> tuple[Any, Any]:
        """cos and a signed sin, [batch, 1, tokens, head_dim]: ``x*cos + roll(x)*sin`` rotates like transformers."""
        cos, sin = self.model.model.rotary_emb(x, positions)
        half = self.head_dim // 2
        sin = self.torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def forward(self, weights: Any, ids: Any, positions: Any, attend: Any, keep: Any = None) -> Any:
        """Next-token logits (float32) of the last position of each row of ``ids`` ([rows, tokens]).

        ``attend(layer, q, k, v)`` stores the new keys and values and returns the attention output
        [rows, tokens, heads*head_dim]; ``keep`` (an index) limits the output layer to those rows.
        """
        torch, F = self.torch, self.F
        embed, layers, (norm_w, norm_eps), (head_w, head_b) = weights
        rows, tokens = ids.shape
        packed = self.packed if ids.device.type == "cpu" else None
        # packed: each layer's four products (q, k and v as one, o, gate and up as one, down), then the output layer
        prepared = packed.prepare(self.product_groups(layers, head_w, head_b)) if packed is not None else None
        product: Any = packed.product if packed is not None else None
        linear = self._linear(ids.device, rows * tokens)
        hq, hk, d, hidden, eps = self.heads, self.kv_heads, self.head_dim, self.hidden, self.eps
        x = F.embedding(ids, embed)
        cos, sin = self.rope(x, positions)
        half, qk_width = d // 2, (hq + hk) * d
        for i, (ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, wg, bg, wu, bu, wd, bd) in enumerate(layers):
            h = F.rms_norm(x, (hidden,), ln1, eps)
            if prepared is not None:
                qkv = product(h, prepared[4 * i])
            else:
                qkv = torch.cat((linear(h, wq, bq), linear(h, wk, bk), linear(h, wv, bv)), -1)
            # q and k rotate together: x*cos + (x's halves swapped)*sin
            qk = qkv[..., :qk_width].unflatten(-1, (hq + hk, d)).transpose(1, 2)
            qk = torch.addcmul(qk * cos, qk.unflatten(-1, (2, half)).flip(-2).flatten(-2), sin)
            v = qkv[..., qk_width:].unflatten(-1, (hk, d)).transpose(1, 2)
            out = attend(i, qk[:, :hq], qk[:, hq:], v)
            x = x + (product(out, prepared[4 * i + 1]) if prepared is not None else linear(out, wo, bo))
            h = F.rms_norm(x, (hidden,), ln2, eps)
            if prepared is not None:
                gate, up = product(h, prepared[4 * i + 2]).chunk(2, -1)
            else:
                gate, up = linear(h, wg, bg), linear(h, wu, bu)
            act = F.silu(gate) * up
            x = x + (product(act, prepared[4 * i + 3]) if prepared is not None else linear(act, wd, bd))
        x = x[:, -1]
        if keep is not None:
            x = x[keep]
        x = F.rms_norm(x, (hidden,), norm_w, norm_eps)
        if prepared is not None:
            return product(x, prepared[-1]).float()
        return self._linear(ids.device, x.shape[0])(x, head_w, head_b).float()

    def product_groups(self, layers: list[tuple[Any, ...]], head_w: Any,
                       head_b: Any) -> list[tuple[tuple[Any, ...], ...]]:
        """(weights, biases) of each product of the forward, in order: per layer q/k/v, o, gate/up, down; then the
        output layer. Made once per ``layers`` (a batch's weights), as ``PackedWeights.prepare`` checks by identity."""
        if self._products_of is not layers:
            groups: list[tuple[tuple[Any, ...], ...]] = []
            for (_, wq, bq, wk, bk, wv, bv, wo, bo, _, wg, bg, wu, bu, wd, bd) in layers:
                groups += [((wq, wk, wv), (bq, bk, bv)), ((wo,), (bo,)), ((wg, wu), (bg, bu)), ((wd,), (bd,))]
            groups.append(((head_w,), (head_b,)))
            self._products_of, self._product_groups = layers, groups
        return self._product_groups

    def _linear(self, device: Any, rows: int) -> Any:
        """``F.linear`` or the fastest equal product for ``rows`` rows of activations on ``device``."""
        if device.type != "cpu":
            return self.F.linear
        # a decode step (a few rows, one token each) multiplies weight x activations (few_rows_linear)
        return few_rows_linear(self.torch) if rows <= FEW_ROWS else self.F.linear


def few_rows_linear(torch: Any) -> Any:
    """``F.linear`` for a few rows of activations, computed as (weight @ activations^T)^T.

    On CPU the BLAS's kernel for [few rows] x [weight^T] runs up to ~3.5x slower than the same product
    taken the other way round (measured for SmolLM2's output layer, 49,152 x 576, at 2-8 rows: 19 ms
    against 5 ms); the result is the same product (float rounding apart).
    """
    def linear(x: Any, weight: Any, bias: Any = None) -> Any:
        flat = x.reshape(-1, x.shape[-1])
        out = torch.mm(weight, flat.T).T if bias is None else torch.addmm(bias[:, None], weight, flat.T).T
        return out.reshape(*x.shape[:-1], weight.shape[0])

    return linear


class LeanBatch:
    """The KV cache and positions of one batch's rows, decoded by :class:`LeanLlama`.

    Rows are given in the order :func:`prefill_order` sorts them; ``start`` pre-fills them and returns
    their first next-token logits; ``step`` feeds each live row its newest token; ``drop`` ends rows.
    Logits are returned for the live rows, in order.
    """

    def __init__(self, lean: LeanLlama, prompts: list[list[int]], *, reserve: int, share: bool,
                 store: Any = None, version: int = 0):
        torch = lean.torch
        self.lean, self.torch, self.store, self.version = lean, torch, store, version
        self.prompts = prompts
        self.weights = lean.weights()
        embed = self.weights[0]
        self.device, self.dtype = embed.device, embed.dtype
        self.width = max(len(p) for p in prompts)
        self.capacity = self.width + max(reserve, 1)
        n = len(prompts)
        shape = (n, lean.kv_heads, self.capacity, lean.head_dim)
        self.k = [torch.empty(shape, dtype=self.dtype, device=self.device) for _ in range(lean.layers)]
        self.v = [torch.empty(shape, dtype=self.dtype, device=self.device) for _ in range(lean.layers)]
        self.valid = torch.zeros((n, self.capacity), dtype=torch.bool, device=self.device)
        self.next_pos = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=self.device)
        self.column = self.width  # the cache column the next decode step writes
        self.live = list(range(n))  # cache rows still decoding, in order
        self.starts = [self.width - len(p) for p in prompts]  # per cache row: the column its prompt begins at
        self.share = share
        self.counts = PrefillCounts()

    # -- prefill ------------------------------------------------------------
    def start(self) -> Any:
        """Pre-fill every row; the first next-token logits of each, [rows, vocab]."""
        torch = self.torch
        began = time.perf_counter()
        runs = _runs(self.prompts, self.share)  # (prompt, first row, rows) per distinct prompt
        logits: list[Any] = [None] * len(runs)
        hits = []
        for prompt, row, count in runs:
            self.valid[row:row + count, self.width - len(prompt):self.width] = True
            hits.append(self.store.longest_prefix(prompt, self.version) if self.store is not None else None)
        # prompts of which no earlier sequence covers much may share a start (a system prompt, few-shot examples)
        few = [j for j, hit in enumerate(hits) if hit is None or hit.length < len(runs[j][0]) * SHARED_PREFIX_SHARE]
        common = self._common_prefix([runs[j] for j in few]) if self.share and len(few) > 1 else None
        if common is not None:
            for j in few:
                hit = hits[j]
                if hit is None or hit.length < common.length:
                    hits[j] = common
            self.counts.reused_tokens -= common.length  # computed once here, not taken from an earlier sequence
        plain: list[int] = []
        for j, ((prompt, row, count), hit) in enumerate(zip(runs, hits)):
            if hit is not None:
                logits[j] = self._prefill_extending(prompt, row, count, hit)
            else:
                plain.append(j)
        done = 0
        for group in _length_groups([runs[j] for j in plain]):
            out = self._prefill_group(group)
            for g in range(len(group)):
                logits[plain[done + g]] = out[g:g + 1]
            done += len(group)
        c = self.counts
        c.prompts += len(runs)
        c.shared += sum(1 for _, _, count in runs if count > 1)
        c.rows_saved += len(self.prompts) - len(runs)
        expanded = [lg.expand(count, -1) if count > 1 else lg for lg, (_, _, count) in zip(logits, runs)]
        out = torch.cat(expanded, dim=0)
        c.seconds += time.perf_counter() - began
        return out

    def _common_prefix(self, runs: list[tuple[list[int], int, int]]) -> Hit | None:
        """The keys and values of the start the prompts share, when it is most of each (else ``None``)."""
        prompts = [prompt for prompt, _, _ in runs]
        shortest = min(len(p) for p in prompts)
        length = min(len(os.path.commonprefix(prompts)), shortest - 1)  # each prompt's last token is computed
        if length < max(SHARED_PREFIX_MIN, shortest * SHARED_PREFIX_SHARE):
            return None
        part = LeanBatch(self.lean, [prompts[0][:length]], reserve=1, share=False, version=self.version)
        part.start()
        keys, values, covered = part.keys_values(0)
        return Hit(keys, values, covered)

    def _prefill_group(self, group: list[tuple[list[int], int, int]]) -> Any:
        """One forward pass over prompts of similar length whose rows are consecutive in the cache."""
        torch, lean = self.torch, self.lean
        width = max(len(p) for p, _, _ in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        valid = torch.zeros((len(group), width), dtype=torch.bool)
        for i, (prompt, _, _) in enumerate(group):
            ids[i, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            valid[i, width - len(prompt):] = True
        ids, valid = ids.to(self.device), valid.to(self.device)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones((width, width), dtype=torch.bool, device=self.device).tril()
        mask = (causal & valid[:, None, :]) | torch.eye(width, dtype=torch.bool, device=self.device)
        mask = mask[:, None]  # padding queries see themselves only: no row of the mask is empty
        first, last = group[0][1], group[-1][1] + group[-1][2]
        counts = [count for _, _, count in group]
        repeat = torch.tensor(counts, device=self.device) if any(c > 1 for c in counts) else None
        col = self.width - width

        def attend(i: int, q: Any, k: Any, v: Any) -> Any:
            for cache, new in ((self.k[i], k), (self.v[i], v)):
                if col:
                    cache[first:last, :, :col].zero_()
                cache[first:last, :, col:self.width].copy_(new if repeat is None
                                                           else new.repeat_interleave(repeat, dim=0))
            o = attention(torch, q, k, v, mask)
            return o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

        return lean.forward(self.weights, ids, positions, attend)

    def _prefill_extending(self, prompt: list[int], row: int, count: int, hit: Any) -> Any:
        """Pre-fill a prompt that extends a stored sequence: its keys and values copied, the rest computed."""
        torch, lean = self.torch, self.lean
        reused = hit.length
        start = self.width - len(prompt)
        rows = slice(row, row + count)
        for i in range(lean.layers):
            if start:
                self.k[i][rows, :, :start].zero_()
                self.v[i][rows, :, :start].zero_()
            self.k[i][rows, :, start:start + reused].copy_(hit.keys[i][:, :, :reused].expand(count, -1, -1, -1))
            self.v[i][rows, :, start:start + reused].copy_(hit.values[i][:, :, :reused].expand(count, -1, -1, -1))
        new = prompt[reused:]
        ids = torch.tensor([new], dtype=torch.long, device=self.device)
        positions = torch.arange(reused, len(prompt), device=self.device)[None]
        # query t (absolute position reused+t) sees keys up to its own position
        mask = (torch.arange(len(prompt), device=self.device)[None, :]
                <= torch.arange(reused, len(prompt), device=self.device)[:, None])[None, None]

        def attend(i: int, q: Any, k: Any, v: Any) -> Any:
            self.k[i][rows, :, start + reused:self.width].copy_(k.expand(count, -1, -1, -1))
            self.v[i][rows, :, start + reused:self.width].copy_(v.expand(count, -1, -1, -1))
            keys, values = self.k[i][row:row + 1, :, start:self.width], self.v[i][row:row + 1, :, start:self.width]
            o = attention(torch, q, keys, values, mask)
            return o.transpose(1, 2).reshape(1, len(new), -1)

        self.counts.reused_tokens += reused * count
        return lean.forward(self.weights, ids, positions, attend)

    # -- decode ---------------------------------------------------------------
    def step(self, tokens: list[int]) -> Any:
        """Feed each live row its newest token; the next-token logits of the live rows, [live, vocab]."""
        torch, lean = self.torch, self.lean
        held = self.k[0].shape[0]
        if self.column >= self.capacity:
            raise RuntimeError("the batch's KV cache is full: a row decoded past the room reserved for it")
        ids = torch.zeros((held, 1), dtype=torch.long)
        live = torch.tensor(self.live, dtype=torch.long)
        ids[live, 0] = torch.tensor(tokens, dtype=torch.long)
        ids = ids.to(self.device)
        col = self.column
        self.valid[:, col] = True
        # one additive mask for every layer (scaled_dot_product_attention would turn a boolean one into it at
        # each call), or none where no row has a column to hide
        seen = self.valid[:, :col + 1]
        mask = None
        if not bool(seen.all()):
            mask = torch.zeros((held, 1, 1, col + 1), dtype=self.dtype, device=self.device)
            mask.masked_fill_(~seen[:, None, None], -math.inf)
        rows = held

        def attend(i: int, q: Any, k: Any, v: Any) -> Any:
            keys, values = self.k[i], self.v[i]
            keys[:, :, col:col + 1].copy_(k)
            values[:, :, col:col + 1].copy_(v)
            o = written_attention(torch, q, keys[:, :, :col + 1], values[:, :, :col + 1], mask)
            return o.reshape(rows, 1, -1)

        positions = self.next_pos[:, None]
        logits = lean.forward(self.weights, ids, positions, attend,
                              keep=None if len(self.live) == held else live.to(self.device))
        self.column += 1
        self.next_pos += 1
        return logits

    def drop(self, slots: list[int]) -> None:
        """End the live rows at these positions among the live rows (they finished)."""
        gone = set(slots)
        self.live = [r for s, r in enumerate(self.live) if s not in gone]
        held = self.k[0].shape[0]
        if self.live and (held - len(self.live)) * 8 >= held:  # enough dead rows to pay for the copy
            keep = self.torch.tensor(self.live, dtype=self.torch.long, device=self.device)
            n = len(self.live)
            for caches in (self.k, self.v):
                for i, cache in enumerate(caches):
                    cache[:n, :, :self.column] = cache[keep, :, :self.column]
                    caches[i] = cache[:n]
            self.valid = self.valid[keep]
            self.next_pos = self.next_pos[keep]
            self.starts = [self.starts[r] for r in self.live]
            self.prompts = [self.prompts[r] for r in self.live]
            self.live = list(range(n))

    def absorb(self, other: LeanBatch) -> None:
        """Take in the rows of ``other``, a batch just pre-filled (requests joining this running batch).

        Its rows go after this batch's live rows. Both batches are right-aligned at the column their next
        step writes, so the merged cache aligns them there: the older rows' keys and values and the new
        rows' are copied once into a cache wide enough for the longer history and the larger room left.
        Keys and values do not depend on the column they sit in (positions are per row, padding is
        masked), so every row computes what it would alone.
        """
        if other.column != other.width:
            raise RuntimeError("only a batch that has not decoded yet can join another")
        torch = self.torch
        live = torch.tensor(self.live, dtype=torch.long, device=self.device)
        mine, theirs = len(self.live), len(other.live)
        left = max(self.column, other.column)
        room = max(self.capacity - self.column, other.capacity - other.column)
        shift, other_shift = left - self.column, left - other.column
        capacity = left + room
        for caches, joined in ((self.k, other.k), (self.v, other.v)):
            for i, cache in enumerate(caches):
                merged = cache.new_empty((mine + theirs, *cache.shape[1:2], capacity, cache.shape[3]))
                if shift:
                    merged[:mine, :, :shift].zero_()
                merged[:mine, :, shift:left].copy_(cache[live, :, :self.column])
                if other_shift:
                    merged[mine:, :, :other_shift].zero_()
                merged[mine:, :, other_shift:left].copy_(joined[i][:, :, :other.column])
                caches[i] = merged
        valid = torch.zeros((mine + theirs, capacity), dtype=torch.bool, device=self.device)
        valid[:mine, shift:left] = self.valid[live, :self.column]
        valid[mine:, other_shift:left] = other.valid[:, :other.column]
        self.valid = valid
        self.next_pos = torch.cat([self.next_pos[live], other.next_pos])
        self.starts = [self.starts[r] + shift for r in self.live] + [s + other_shift for s in other.starts]
        self.prompts = [self.prompts[r] for r in self.live] + other.prompts
        self.column, self.capacity, self.width = left, capacity, left
        self.live = list(range(mine + theirs))
        c, o = self.counts, other.counts
        c.prompts += o.prompts
        c.shared += o.shared
        c.rows_saved += o.rows_saved
        c.reused_tokens += o.reused_tokens
        c.seconds += o.seconds
        other.counts = PrefillCounts()

    def keys_values(self, slot: int) -> tuple[list[Any], list[Any], int]:
        """The cached keys and values of a live row (views), and how many tokens they cover."""
        row = self.live[slot]
        start = self.starts[row]
        return ([k[row:row + 1, :, start:self.column] for k in self.k],
                [v[row:row + 1, :, start:self.column] for v in self.v], self.column - start)

    def row_of_slot(self, slot: int) -> int:
        return self.live[slot]


def prefill_order(prompt: list[int]) -> tuple[int, tuple[int, ...]]:
    """Sort key of a batch's rows: longest prompts first, identical prompts side by side."""
    return (-len(prompt), tuple(prompt))


def _runs(prompts: list[list[int]], share: bool) -> list[tuple[list[int], int, int]]:
    """(prompt, first row, number of rows) for each run of identical consecutive prompts (each row when not share)."""
    runs: list[tuple[list[int], int, int]] = []
    for row, prompt in enumerate(prompts):
        if share and runs and runs[-1][0] == prompt:
            runs[-1] = (prompt, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((prompt, row, 1))
    return runs


def _length_groups(runs: list[tuple[list[int], int, int]]) -> list[list[tuple[list[int], int, int]]]:
    """Consecutive runs (longest first) grouped so that padding stays small and a group's work bounded."""
    groups: list[list[tuple[list[int], int, int]]] = []
    for run in runs:
        if groups:
            group = groups[-1]
            width = len(group[0][0])
            contiguous = group[-1][1] + group[-1][2] == run[1]
            if (contiguous and len(run[0]) >= width * (1 - PREFILL_PADDING)
                    and width * (len(group) + 1) <= PREFILL_TOKENS):
                group.append(run)
                continue
        groups.append([run])
    return groups
