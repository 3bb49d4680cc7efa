"""Copies of a model's linear weights in oneDNN's blocked layout, for the lean forward on CPU.

A decode step multiplies a few rows of activations by every weight matrix of the model, so reading the
weights is most of the step. Reordered once into oneDNN's blocked layout, a weight is read close to the
memory's bandwidth; the plain product reads it about half as fast. Measured here (one thread, 1,536 x 576,
a fresh matrix each call): 114 against 220 us for one row in float32, 330 against 780 us for 32 rows,
66 against 124 us for one row in bfloat16.

The copies are packed for a batch of :data:`BATCH_HINT` rows. With that hint a row's result does not
depend on the rows beside it (the same numbers alone as in a batch of 100), so batching stays invisible
in the logprobs.

A copy is made again when its parameter changes. torch counts every in-place change to a tensor
(an optimizer's step, ``load_state_dict``, a ``copy_`` under ``no_grad``) in the tensor's version, and a
parameter given new storage has a new data pointer; both are compared at every forward. A change made
through ``param.data`` is not counted by torch, which is why a model the engine does not own (``wrap``)
is not packed unless asked; the engine also drops every copy when its weights are updated.

With ``half`` the copies hold the weights in float16 and the products are fbgemm's: float16 weights
widened to float32 in registers, float32 activations and sums. A step then reads half the bytes:
66 against 114 us for one row of 1,536 x 576, 1.5 against 2.9 ms for SmolLM2's output layer, the same
at 512 rows. Only the weights are rounded (to 11 significant bits); everything else stays float32, and a
row's result is again bit for bit the same alone as in a batch.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: Rows the copies are packed for (see the module's docstring: rows are then independent of each other).
BATCH_HINT = 32


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux's MemAvailable), or ``None`` when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def packing_unsupported(torch: Any, dtype: Any, device: Any, nbytes: int = 0,
                        what: str = "the packed copies") -> str | None:
    """Why ``nbytes`` of weights of ``dtype`` on ``device`` are not packed (``None`` when they can be).

    The copies take the weights' memory once more: they are not made when that is more than half the
    memory available now (a larger model on a laptop would otherwise start swapping, or be killed).
    """
    if getattr(device, "type", device) != "cpu":
        return f"device {device} (packing is for CPU products)"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build has no oneDNN"
    if dtype == torch.bfloat16:
        supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        if supported is None or not supported():
            return "this CPU has no native bfloat16 arithmetic"
    elif dtype != torch.float32:
        return f"dtype {dtype} (float32 and bfloat16 are packed)"
    available = available_memory() if nbytes else None
    if available is not None and nbytes > available // 2:
        return (f"{what} ({nbytes / 2**30:.1f} GiB) would take more than half the memory "
                f"available ({available / 2**30:.1f} GiB)")
    return None


#: Threads that make copies at once (torch's products let go of Python's lock while they run).
PACK_THREADS = min(2, os.cpu_count() or 1)


def _stamp(weights: tuple[Any, ...], biases: tuple[Any, ...]) -> tuple[tuple[int, int], ...]:
    """What changes when a tensor does: torch's count of its in-place changes, and its data's address."""
    return tuple((t._version, t.data_ptr()) for t in weights + biases if t is not None)


#: The largest finite float16.
HALF_MAX = 65504.0


def half_unsupported(torch: Any, largest: float) -> str | None:
    """Why weights whose largest magnitude is ``largest`` are not kept in float16 (``None`` when they can be)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines or not hasattr(
            torch.ops.quantized, "linear_dynamic_fp16"):
        return "this torch build has no fbgemm (its kernel multiplies float16 weights by float32 activations)"
    if not largest <= HALF_MAX:  # also NaN
        return f"a weight of magnitude {largest:g} is beyond float16's range"
    return None


def linear_weights(torch: Any, model: Any) -> list[Any]:
    """The weights of ``model``'s linear layers (its output layer included), each once (a tied one is one)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            found.setdefault(id(module.weight), module.weight)
    return list(found.values())


def model_half_unsupported(torch: Any, model: Any, rounds: bool = False) -> str | None:
    """Why ``model``'s linear weights are not kept in float16 on CPU (``None`` when they can be): a float32
    model on CPU, fbgemm in this torch, every weight within float16's range. With ``rounds`` (the model is to
    be rounded: :func:`round_to_half`) its rounded weights' storage of their own (4 bytes a weight) must fit
    beside the float16 copies (2 bytes) in half the memory available."""
    weights = linear_weights(torch, model)
    if not weights:
        return "the model has no linear layers"
    if weights[0].device.type != "cpu" or weights[0].dtype != torch.float32:
        return f"{weights[0].dtype} on {weights[0].device} (float16 copies are for float32 models on CPU)"
    # the largest magnitude, from each weight's least and greatest (aminmax reads it once and copies nothing)
    ends = [float(v) for w in weights for v in torch.aminmax(w.detach())]
    why = half_unsupported(torch, math.nan if any(v != v for v in ends) else max(map(abs, ends)))
    if why is None and rounds:
        why = packing_unsupported(torch, torch.float32, "cpu", sum(w.numel() for w in weights) * 6,
                                  what="float16 copies and the rounded weights' own storage")
    return why


def round_to_half(torch: Any, model: Any, in_place: bool = False, made: dict[int, Any] | None = None) -> None:
    """Round ``model``'s linear weights to float16, in float32 still: its own forward is then the one its
    float16 copies compute. Only for a model scaffold loaded (an engine's, a teacher's).

    Just loaded, the model's tensors are mapped from its safetensors file: written in place, each page
    would be copied on its first write (0.95 against 0.14 s for SmolLM2-135M). So each linear weight gets
    new storage, and so does every other tensor of the model (its norms: a few kB), which lets the file's
    mapping go (else its pages stay counted in the process's memory beside the new ones: 540 MB here).
    Weights updated since (copied into that storage) are rounded ``in_place`` (0.04 s). ``made``: weights
    already rounded elsewhere (``preload.py``), by the id of the weight they replace."""
    made = made or {}
    with torch.no_grad():
        linear = linear_weights(torch, model)
        for w in linear:
            if in_place:
                w.copy_(w.to(torch.float16))
            else:
                w.data = made[id(w)] if id(w) in made else w.to(torch.float16).to(torch.float32)
        if not in_place:
            rounded = {id(w) for w in linear}
            for t in [*model.parameters(), *model.buffers()]:
                if id(t) not in rounded:
                    t.data = t.detach().clone()


class PackedWeights:
    """Packed copies of weight tensors, each made on first use and again when its tensor changes."""

    def __init__(self, torch: Any, half: bool = False):
        self.torch = torch
        self.half = half  # float16 copies multiplied by fbgemm's kernel (the module's docstring)
        # ids of the weights -> (the weights, their and their biases' (version, data pointer), copy, bias)
        self._copies: dict[tuple[int, ...], tuple[tuple[Any, ...], tuple[tuple[int, int], ...], Any, Any]] = {}
        self.packs = 0  # copies made (the first ones and those made again after a change)
        self._groups: Any = None  # the groups prepare() saw last, their tensors, their stamps and copies
        self._tensors: list[Any] = []
        self._stamps: list[tuple[int, int]] = []
        self._prepared: list[tuple[Any, Any]] = []

    def get(self, weights: tuple[Any, ...], biases: tuple[Any, ...]) -> tuple[Any, Any]:
        """The packed copy of ``weights`` stacked (one product for several layers that read the same input)
        and their biases stacked (``None`` when none has one); made now if there is none or a tensor changed."""
        found = self._current(weights, biases)
        return found if found is not None else self._keep(weights, biases, self._pack(weights, biases))

    def _current(self, weights: tuple[Any, ...], biases: tuple[Any, ...]) -> tuple[Any, Any] | None:
        entry = self._copies.get(tuple(id(w) for w in weights))
        if entry is not None and entry[1] == _stamp(weights, biases) and all(a is b for a, b in zip(entry[0], weights)):
            return entry[2], entry[3]
        return None

    def _pack(self, weights: tuple[Any, ...], biases: tuple[Any, ...]) -> tuple[Any, Any]:
        """A new copy and bias (reads the tensors only: several run at once on threads of their own)."""
        torch = self.torch
        with torch.no_grad():
            stacked = weights[0] if len(weights) == 1 else torch.cat(weights, dim=0)
            bias = None
            if any(b is not None for b in biases):
                bias = torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0])
                                  for w, b in zip(weights, biases)])
            if self.half:  # fbgemm keeps the bias with the weights
                return torch.ops.quantized.linear_prepack_fp16(stacked.detach(), bias), None
            return torch.ops.mkldnn._reorder_linear_weight(stacked.detach(), BATCH_HINT), bias

    def adopt(self, weights: tuple[Any, ...], biases: tuple[Any, ...], made: tuple[Any, Any]) -> None:
        """Keep ``made``, a copy of ``weights`` and ``biases`` as :meth:`get` would make it, made elsewhere
        (``preload.py``)."""
        self._keep(weights, biases, made)
        self._groups = None

    def _keep(self, weights: tuple[Any, ...], biases: tuple[Any, ...], made: tuple[Any, Any]) -> tuple[Any, Any]:
        self._copies[tuple(id(w) for w in weights)] = (weights, _stamp(weights, biases), *made)
        self.packs += 1
        return made

    def prepare(self, groups: list[tuple[tuple[Any, ...], ...]]) -> list[tuple[Any, Any]]:
        """:meth:`get` for each ``(weights, biases)`` of ``groups`` (a forward's products, in order), with one
        check of every tensor's stamp for the lot: a decode step makes over a hundred products, and checking
        each one apart costs more than the check itself. Copies to make are made on :data:`PACK_THREADS`
        threads (fbgemm packs float16 at about 9 ns a weight: 0.6 s for SmolLM2-135M on one thread)."""
        if groups is not self._groups:
            self._groups = groups
            self._tensors = [t for weights, biases in groups for t in weights + biases if t is not None]
        elif [(t._version, t.data_ptr()) for t in self._tensors] == self._stamps:
            return self._prepared
        stale = [g for g in groups if self._current(*g) is None]
        if len(stale) > 1 and PACK_THREADS > 1:
            with ThreadPoolExecutor(PACK_THREADS, thread_name_prefix="scaffold-pack") as pool:
                for (weights, biases), made in zip(stale, pool.map(lambda g: self._pack(*g), stale)):
                    self._keep(weights, biases, made)
        self._prepared = [self.get(weights, biases) for weights, biases in groups]
        self._stamps = [(t._version, t.data_ptr()) for t in self._tensors]
        return self._prepared

    def product(self, x: Any, prepared: tuple[Any, Any]) -> Any:
        """``x`` times a prepared copy plus its bias: each of its weights' results side by side, in order."""
        packed, bias = prepared
        if self.half:
            return self.torch.ops.quantized.linear_dynamic_fp16(x, packed)
        return self.torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")

    def clear(self) -> None:
        """Drop every copy (the weights were replaced)."""
        self._copies.clear()
        self._groups = None

    def keep_only(self, weights: set[int]) -> None:
        """Drop the copies of tensors other than ``weights`` (ids): a module given a new parameter object."""
        for key in [k for k in self._copies if not weights.issuperset(k)]:
            del self._copies[key]
        self._groups = None
