"""AReaL's tensor dict: what ``arun_episode`` returns for the trainer.

One training sample becomes exactly what AReaL's own RLVR and multi-turn
workflows build (``areal/workflow/rlvr.py``, ``multi_turn.py``):

=================  =======  ========  ==================================================
key                dtype    shape     content
=================  =======  ========  ==================================================
``input_ids``      int32    [1, L]    prompt + output tokens, exactly as sampled
``loss_mask``      int32    [1, L]    1 on generated tokens, 0 on prompt/environment ones
``logprobs``       float32  [1, L]    behaviour logprob of each token (0.0 where masked)
``versions``       int32    [1, L]    weight version that sampled each token (-1 where masked)
``turn_ids``       int32    [1, L]    model turn of each generated token, 0, 1, ... (-1 where masked)
``attention_mask`` bool     [1, L]    all True
``rewards``        float32  [1]       the sample's reward
=================  =======  ========  ==================================================

Position ``i`` describes ``input_ids[i]``; AReaL's trainer does the
next-token shift itself. An episode with several samples (``majority_vote``)
returns ``[k, L]`` joined the way AReaL's ``concat_padded_tensors`` joins
episodes: right padding with 0 (``attention_mask`` False), ``rewards`` [k].
``turn_ids`` is left out for AReaL releases that predate it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

KEYS = ("input_ids", "loss_mask", "logprobs", "versions", "turn_ids", "attention_mask", "rewards")


@dataclass(slots=True)
class TokenRow:
    """One training sequence in AReaL's terms (before tensors)."""

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float

    def check(self) -> TokenRow:
        n = len(self.input_ids)
        for key in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, key)) != n:
                raise ValueError(f"{key} has {len(getattr(self, key))} entries for {n} input_ids")
        return self


def turn_ids_of(loss_mask: Sequence[int]) -> list[int]:
    """Each run of generated tokens (mask 1) is one model turn, numbered from 0; -1 elsewhere."""
    out: list[int] = []
    turn = -1
    previous = 0
    for m in loss_mask:
        if m and not previous:
            turn += 1
        out.append(turn if m else -1)
        previous = m
    return out


def tensor_dict(rows: Sequence[TokenRow], *, turn_ids: bool = True) -> dict[str, Any]:
    """The tensor dict of one episode's rows (``[1, L]`` for one row, ``[k, max L]`` right-padded for k)."""
    import torch

    if not rows:
        raise ValueError("an episode's tensor dict needs at least one row")
    width = max(len(r.input_ids) for r in rows)
    k = len(rows)

    def stack(values: Any, dtype: Any) -> Any:
        out = torch.zeros((k, width), dtype=dtype)
        for i, row in enumerate(rows):
            seq = values(row)
            out[i, : len(seq)] = torch.tensor(seq, dtype=dtype)
        return out

    out = {
        "input_ids": stack(lambda r: r.input_ids, torch.int32),
        "loss_mask": stack(lambda r: r.loss_mask, torch.int32),
        "logprobs": stack(lambda r: r.logprobs, torch.float32),
        "versions": stack(lambda r: r.versions, torch.int32),
        "turn_ids": stack(lambda r: turn_ids_of(r.loss_mask), torch.int32),
        "attention_mask": stack(lambda r: [True] * len(r.input_ids), torch.bool),
        "rewards": torch.tensor([float(r.reward) for r in rows], dtype=torch.float32),
    }
    if not turn_ids:
        del out["turn_ids"]
    return out
