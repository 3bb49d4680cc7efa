"""A model's rounded weights and their float16 copies, made on a thread of their own while the engine imports
transformers.

An engine that loads its model spends most of its start importing transformers' model and tokenizer code
(about 2 s here), Python work that holds the interpreter's lock and keeps one core busy. Rounding the linear
weights to float16 (:func:`~.packed_weights.round_to_half`) and packing their float16 copies
(:class:`~.packed_weights.PackedWeights`) are the opposite: about a second of torch work on one core, without
the lock, which the first forward pass would otherwise wait for. So where the weights are a local safetensors
file (the converted-GGUF cache, or a checkpoint folder) and a core is spare, :class:`Preload` reads them from
the file, rounds and packs them while the imports run, and the engine takes what it made once the model is
loaded (:meth:`Preload.apply`): the same tensors and copies the engine would make, made earlier.

The copies follow the lean forward's products (:meth:`~.lean_llama.LeanLlama.product_groups`): per layer
q/k/v stacked, o, gate/up stacked, down, then the output layer (the embedding when the file has no
``lm_head.weight``: tied). Products with biases are left to the forward. Anything that does not match the
loaded model (a name, a shape, a dtype) is not used, and the engine makes it as before.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scaffold_core.engines.model_loading import cached_model_dir

from .packed_weights import linear_weights, packing_unsupported, round_to_half

log = logging.getLogger("scaffold.engine")

#: The file a checkpoint folder keeps its weights in (one file; sharded checkpoints are not preloaded).
WEIGHTS_FILE = "model.safetensors"
#: The products of one layer, by their weights' names under ``model.layers.<i>.``, as the lean forward makes them.
LAYER_PRODUCTS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
                  ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))
#: Seconds the engine waits for an unfinished preload before making the weights itself.
WAIT_S = 600.0


class Preload(threading.Thread):
    """Reads ``find()``'s safetensors file (``None``: nothing to preload) on a thread of its own, on ``threads``
    torch threads; see the module's docstring. ``find`` runs on that thread, once torch is imported."""

    def __init__(self, find: Callable[[], Path | None], threads: int = 1):
        super().__init__(name="scaffold-preload", daemon=True)
        self.find = find
        self.threads = threads  # torch's threads for this thread's work (the count the engine sets too)
        self.rounded: dict[str, Any] = {}  # weight name -> its values rounded to float16, in float32
        self.copies: dict[tuple[str, ...], Any] = {}  # product's weight names -> its packed float16 copy
        self.error: BaseException | None = None
        self._cancelled = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            self._make()
        except BaseException as exc:  # the engine makes the weights itself
            self.error = exc

    def cancel(self) -> None:
        """Stop making more (the engine does not need them)."""
        self._cancelled.set()

    def _make(self) -> None:
        import torch  # waits for the engine's own import of torch when that has begun
        from safetensors import safe_open

        path = self.find()
        if path is None or self._cancelled.is_set():
            return
        torch.set_num_threads(self.threads)
        # the engine's own rule for its rounded weights (4 bytes a weight, the file's size) and copies (2 more)
        if packing_unsupported(torch, torch.float32, "cpu", path.stat().st_size * 3 // 2) is not None:
            return
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            head = "lm_head.weight" if "lm_head.weight" in names else "model.embed_tokens.weight"
            products = [tuple(f"{prefix}.{name}.weight" for name in group)
                        for prefix in _layer_prefixes(names) for group in LAYER_PRODUCTS] + [(head,)]
            for group in products:
                if self._cancelled.is_set():
                    return
                if not names.issuperset(group):
                    continue
                weights = []
                for name in group:
                    value = f.get_tensor(name)
                    if value.dtype != torch.float32 or value.dim() != 2:
                        return  # not a float32 model: the engine does not round it
                    weights.append(value.to(torch.float16).to(torch.float32))
                self.rounded.update(zip(group, weights))
                if not any(f"{name[:-len('weight')]}bias" in names for name in group):
                    stacked = weights[0] if len(weights) == 1 else torch.cat(weights, dim=0)
                    self.copies[group] = torch.ops.quantized.linear_prepack_fp16(stacked, None)

    def apply(self, torch: Any, model: Any, lean: Any) -> bool:
        """Give ``model`` (loaded from the same file) the rounded weights and ``lean`` the copies made; True
        when every linear weight of the model was rounded here (else the engine rounds the model itself).
        What does not match the model is left out."""
        self.join(WAIT_S)
        if self.is_alive() or self.error is not None or not self.rounded:
            if self.error is not None:
                log.debug("preloading the weights failed: %s", self.error)
            self.cancel()
            return False
        named = {id(p): name for name, p in model.named_parameters()}
        made = {}
        for weight in linear_weights(torch, model):
            value = self.rounded.get(named.get(id(weight), ""))
            if value is None or value.shape != weight.shape or value.dtype != weight.dtype:
                return False
            made[id(weight)] = value
        round_to_half(torch, model, made=made)
        if lean.packed is not None:
            _, layers, _, (head_w, head_b) = lean.weights()
            for weights, biases in lean.product_groups(layers, head_w, head_b):
                copy = self.copies.get(tuple(named.get(id(w), "") for w in weights))
                if copy is not None and all(b is None for b in biases):
                    lean.packed.adopt(weights, biases, (copy, None))
        self.rounded, self.copies = {}, {}
        return True


def _layer_prefixes(names: set[str]) -> list[str]:
    """``model.layers.<i>`` for every layer the file has, in order."""
    found = set()
    for name in names:
        parts = name.split(".")
        if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
            found.add(int(parts[2]))
    return [f"model.layers.{i}" for i in sorted(found)]


def preload_path(source: Any) -> Path | None:
    """The safetensors file the engine will load ``source`` from: the converted cache of a GGUF file, or a
    local checkpoint folder's single weights file (``None`` otherwise)."""
    if source.gguf_file:
        folder = cached_model_dir(source)
        return folder / WEIGHTS_FILE if folder is not None else None
    path = Path(os.path.expanduser(source.location)) / WEIGHTS_FILE
    return path if path.is_file() else None
