"""Loading new weights into a live model: from a state dict or a Hugging Face checkpoint directory.

Weights are copied into the model's existing parameters and buffers
(``load_state_dict``), so the model object, its device and its dtype stay
what they were, and anyone holding the model (a trainer) keeps seeing it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scaffold_core.errors import EngineError

#: Weight files of a Hugging Face checkpoint directory, in the order they are looked for.
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_FILE = "model.safetensors"
TORCH_INDEX = "pytorch_model.bin.index.json"
TORCH_FILE = "pytorch_model.bin"


def read_checkpoint(directory: str | Path) -> dict[str, Any]:
    """The state dict saved in ``directory`` (``save_pretrained`` output: safetensors, sharded or not, or .bin)."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise EngineError(f"checkpoint {directory}: not a directory (give the folder save_pretrained wrote)",
                          retryable=False)
    if (path / SAFETENSORS_INDEX).is_file() or (path / SAFETENSORS_FILE).is_file():
        from safetensors.torch import load_file

        files = _shards(path, SAFETENSORS_INDEX, SAFETENSORS_FILE)
        state: dict[str, Any] = {}
        for f in files:
            state.update(load_file(str(f), device="cpu"))
        return state
    if (path / TORCH_INDEX).is_file() or (path / TORCH_FILE).is_file():
        import torch

        state = {}
        for f in _shards(path, TORCH_INDEX, TORCH_FILE):
            state.update(torch.load(str(f), map_location="cpu", weights_only=True))
        return state
    raise EngineError(f"checkpoint {directory}: no {SAFETENSORS_FILE}, {TORCH_FILE} or their shard indexes there",
                      retryable=False)


def _shards(path: Path, index_name: str, single: str) -> list[Path]:
    index = path / index_name
    if not index.is_file():
        return [path / single]
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"checkpoint {path}: unreadable {index_name} ({exc})", retryable=False) from exc
    files = [path / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise EngineError(f"checkpoint {path}: shards named in {index_name} are missing: {', '.join(missing)}",
                          retryable=False)
    return files


def load_weights(model: Any, source: Mapping[str, Any] | str | Path) -> int:
    """Copy ``source`` (a state dict or a checkpoint directory) into ``model``; return how many tensors changed.

    Every tensor must name a parameter or buffer of the model and have its
    shape (a mistake is an EngineError and nothing is copied). Tensors the
    source lacks keep their values: a checkpoint of a model with tied
    embeddings omits the tied copy, and a partial state dict updates part of
    the model. Values are cast to the model's dtype and device.
    """
    import torch

    state = read_checkpoint(source) if isinstance(source, (str, Path)) else source
    if not isinstance(state, Mapping):
        raise EngineError(f"weights must be a state dict (name -> tensor) or a checkpoint directory, "
                          f"got {type(state).__name__}", retryable=False)
    own = model.state_dict()
    unknown = [k for k in state if k not in own]
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise EngineError(f"weights name tensors the model does not have: {shown}", retryable=False)
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise EngineError(f"weights[{name!r}] is a {type(value).__name__}, not a tensor", retryable=False)
        if tuple(value.shape) != tuple(own[name].shape):
            raise EngineError(f"weights[{name!r}] has shape {tuple(value.shape)}; the model's is "
                              f"{tuple(own[name].shape)}", retryable=False)
    with torch.no_grad():
        for name, value in state.items():
            own[name].copy_(value)  # state_dict() tensors share storage with the parameters
    return len(state)
