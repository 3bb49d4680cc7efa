"""Right-padded tensor dicts for trainers: the batch format AReaL's trainers consume."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..trajectory import TrainingSample

TENSOR_KEYS = ("input_ids", "attention_mask", "loss_mask", "logprobs", "versions", "rewards")


def to_padded_tensor_dict(samples: Iterable[TrainingSample | dict[str, Any]], *, pad_token_id: int = 0,
                          pad_to: int | None = None) -> dict[str, Any]:
    """Right-pad samples into the tensor dict AReaL trainers consume.

    Keys: ``input_ids`` [B, L] int64, ``attention_mask`` [B, L] bool,
    ``loss_mask`` [B, L] int32, ``logprobs`` [B, L] float32, ``versions``
    [B, L] int32 (-1 on padding), ``rewards`` [B] float32, and
    ``advantages`` [B] float32. Accepts TrainingSample objects or rows of the
    saved trajectories dataset. Needs torch.
    """
    import torch

    rows = [s.to_dict() if isinstance(s, TrainingSample) else dict(s) for s in samples]
    if not rows:
        raise ValueError("no samples to pad")
    lengths = [len(r["input_ids"]) for r in rows]
    width = max(lengths) if pad_to is None else pad_to
    if width < max(lengths):
        raise ValueError(f"pad_to={pad_to} is shorter than the longest sample ({max(lengths)} tokens)")
    batch = len(rows)

    def padded(key: str, fill: Any, dtype: Any) -> Any:
        out = torch.full((batch, width), fill, dtype=dtype)
        for i, row in enumerate(rows):
            values = row[key]
            if values:
                out[i, : len(values)] = torch.tensor(values, dtype=dtype)
        return out

    attention = torch.zeros((batch, width), dtype=torch.bool)
    for i, n in enumerate(lengths):
        attention[i, :n] = True
    return {
        "input_ids": padded("input_ids", pad_token_id, torch.int64),
        "attention_mask": attention,
        "loss_mask": padded("loss_mask", 0, torch.int32),
        "logprobs": padded("logprobs", 0.0, torch.float32),
        "versions": padded("versions", -1, torch.int32),
        "rewards": torch.tensor([float(r["reward"]) for r in rows], dtype=torch.float32),
        "advantages": torch.tensor([float(r.get("advantage", 0.0)) for r in rows], dtype=torch.float32),
    }
