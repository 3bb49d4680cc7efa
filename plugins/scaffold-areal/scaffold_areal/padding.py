"""Tensor dicts for trainers, exactly as AReaL's rollout workflows produce them.

One episode sample becomes what AReaL's ``RolloutWorkflow.arun_episode``
returns (``episode_tensor_dict``): every value has batch dimension 1,

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

Position ``i`` describes token ``input_ids[i]`` (no next-token shift: the
trainer shifts). ``to_padded_tensor_dict`` stacks samples into ``[B, L]``
the way AReaL's ``concat_padded_tensors`` joins episodes: right padding with
0 in every ``[B, L]`` tensor (``attention_mask`` False), ``rewards`` [B].
With on-policy distillation (the samples carry a teacher's ``teacher_logprobs``), ``teacher_logp``
float32 [1, L] joins them: AReaL's own name and alignment for a teacher's logprobs (what its
trainer's teacher ``compute_logp`` stores, and its actor's loss reads as ``input_data["teacher_logp"]``):
entry ``i`` is the teacher's logprob of token ``i + 1`` (the logits at position ``i``), 0.0 at the
last position and where that token is not generated. Every sample of a batch has it, or none.
Advantages are not part of AReaL's batch (its trainer computes them); pass
``advantages=True`` to add the trajectory maker's as ``advantages`` [B]
float32, or use :func:`advantages_tensor`.

The saved ``trajectories/`` dataset keeps one row per sample under the
:class:`~scaffold_core.trajectory.TrainingSample` field names; the one
difference in naming is :data:`DATASET_TO_BATCH` (``reward`` -> ``rewards``,
``advantage`` -> ``advantages``), and both functions here accept those rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from scaffold_core.teacher import shifted
from scaffold_core.trajectory import TrainingSample

#: The keys of AReaL's rollout batch, in the order its RLVR workflow builds them.
TENSOR_KEYS = ("input_ids", "loss_mask", "logprobs", "versions", "turn_ids", "attention_mask", "rewards")

#: Saved-dataset column (TrainingSample field) -> batch key, where the names differ.
DATASET_TO_BATCH = {"reward": "rewards", "advantage": "advantages"}

#: dtype name of every key (torch names): pinned against AReaL's workflow contract.
TENSOR_DTYPES = {"input_ids": "int32", "loss_mask": "int32", "logprobs": "float32", "versions": "int32",
                 "turn_ids": "int32", "attention_mask": "bool", "rewards": "float32", "advantages": "float32",
                 "teacher_logp": "float32"}


def _teacher(rows: list[dict[str, Any]]) -> bool:
    """Whether the rows carry teacher logprobs (all of them, or none: else ValueError)."""
    given = [r.get("teacher_logprobs") is not None for r in rows]
    if any(given) and not all(given):
        raise ValueError(f"{given.count(True)} of {len(rows)} samples carry teacher_logprobs: a batch needs them for "
                         "every sample or none")
    for r in rows:
        if r.get("teacher_logprobs") is not None and len(r["teacher_logprobs"]) != len(r["input_ids"]):
            raise ValueError(f"teacher_logprobs has {len(r['teacher_logprobs'])} entries for "
                             f"{len(r['input_ids'])} input_ids")
    return any(given)


def turn_ids_of(loss_mask: Sequence[int]) -> list[int]:
    """``turn_ids``: each run of generated tokens (mask 1) is one model turn, numbered from 0; -1 elsewhere."""
    out: list[int] = []
    turn = -1
    previous = 0
    for m in loss_mask:
        if m and not previous:
            turn += 1
        out.append(turn if m else -1)
        previous = m
    return out


def _row(sample: TrainingSample | dict[str, Any]) -> dict[str, Any]:
    row = sample.to_dict() if isinstance(sample, TrainingSample) else dict(sample)
    for key in ("input_ids", "loss_mask", "logprobs", "versions"):
        if key not in row:
            raise ValueError(f"a training sample needs {key!r}; got keys {sorted(row)}")
    n = len(row["input_ids"])
    for key in ("loss_mask", "logprobs", "versions"):
        if len(row[key]) != n:
            raise ValueError(f"{key} has {len(row[key])} entries for {n} input_ids")
    if "reward" not in row and "rewards" not in row:
        raise ValueError("a training sample needs a reward ('reward' in scaffold's dataset)")
    return row


def _reward(row: dict[str, Any]) -> float:
    value = row["reward"] if "reward" in row else row["rewards"]
    return float(value if value is not None else 0.0)


def episode_tensor_dict(sample: TrainingSample | dict[str, Any]) -> dict[str, Any]:
    """One sample as AReaL's ``arun_episode`` returns it: every value with batch dimension 1. Needs torch."""
    import torch

    row = _row(sample)
    ids = row["input_ids"]
    return {
        "input_ids": torch.tensor([ids], dtype=torch.int32),
        "loss_mask": torch.tensor([row["loss_mask"]], dtype=torch.int32),
        "logprobs": torch.tensor([row["logprobs"]], dtype=torch.float32),
        "versions": torch.tensor([row["versions"]], dtype=torch.int32),
        "turn_ids": torch.tensor([turn_ids_of(row["loss_mask"])], dtype=torch.int32),
        "attention_mask": torch.ones((1, len(ids)), dtype=torch.bool),
        "rewards": torch.tensor([_reward(row)], dtype=torch.float32),
        **({"teacher_logp": torch.tensor([shifted(row["teacher_logprobs"])], dtype=torch.float32)}
           if _teacher([row]) else {}),
    }


def to_padded_tensor_dict(samples: Iterable[TrainingSample | dict[str, Any]], *, pad_token_id: int = 0,
                          pad_to: int | None = None, advantages: bool = False) -> dict[str, Any]:
    """Right-pad samples into AReaL's rollout batch (see the module docstring for keys, dtypes, shapes).

    Equal to AReaL's ``concat_padded_tensors`` over :func:`episode_tensor_dict`
    of each sample. ``pad_token_id`` fills ``input_ids`` padding (AReaL: 0);
    ``pad_to`` fixes the width; ``advantages=True`` adds ``advantages`` [B].
    Accepts TrainingSample objects or rows of the saved trajectories dataset.
    Needs torch.
    """
    import torch

    rows = [_row(s) for s in samples]
    if not rows:
        raise ValueError("no samples to pad")
    lengths = [len(r["input_ids"]) for r in rows]
    width = max(lengths) if pad_to is None else pad_to
    if width < max(lengths):
        raise ValueError(f"pad_to={pad_to} is shorter than the longest sample ({max(lengths)} tokens)")
    batch = len(rows)

    def padded(values_of: Any, fill: Any, dtype: Any) -> Any:
        out = torch.full((batch, width), fill, dtype=dtype)
        for i, row in enumerate(rows):
            values = values_of(row)
            if len(values):
                out[i, : len(values)] = torch.tensor(values, dtype=dtype)
        return out

    attention = torch.zeros((batch, width), dtype=torch.bool)
    for i, n in enumerate(lengths):
        attention[i, :n] = True
    out = {
        "input_ids": padded(lambda r: r["input_ids"], pad_token_id, torch.int32),
        "loss_mask": padded(lambda r: r["loss_mask"], 0, torch.int32),
        "logprobs": padded(lambda r: r["logprobs"], 0.0, torch.float32),
        "versions": padded(lambda r: r["versions"], 0, torch.int32),
        "turn_ids": padded(lambda r: turn_ids_of(r["loss_mask"]), 0, torch.int32),
        "attention_mask": attention,
        "rewards": torch.tensor([_reward(r) for r in rows], dtype=torch.float32),
    }
    if _teacher(rows):
        out["teacher_logp"] = padded(lambda r: shifted(r["teacher_logprobs"]), 0.0, torch.float32)
    if advantages:
        out["advantages"] = advantages_tensor(rows)
    return out


def advantages_tensor(samples: Iterable[TrainingSample | dict[str, Any]]) -> Any:
    """The trajectory maker's advantages, [B] float32 (0.0 where a sample has none). Needs torch."""
    import torch

    rows = [s.to_dict() if isinstance(s, TrainingSample) else dict(s) for s in samples]
    values = [r.get("advantage", r.get("advantages")) for r in rows]
    return torch.tensor([float(v) if v is not None else 0.0 for v in values], dtype=torch.float32)
