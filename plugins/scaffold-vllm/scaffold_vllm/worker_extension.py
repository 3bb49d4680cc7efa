"""Runs inside vLLM's worker processes: loads a checkpoint directory into the model being served.

vLLM mixes this class into its workers when a server starts with
``--worker-extension-cls scaffold_vllm.worker_extension.WeightLoader`` (the
launcher adds it); the engine then calls ``POST /collective_rpc`` with
``{"method": "scaffold_load_weights", "args": ["/abs/checkpoint"]}``, and
every worker (each tensor-parallel rank) reads the directory's
``*.safetensors`` files and hands the tensors to the model's own
``load_weights``, which maps the names and shards them (what TRL's vLLM
weight sync does too). Weights that a model post-processes after loading
(quantized checkpoints) need vLLM's weight-transfer API instead
(``weight_sync: transfer``). Nothing here runs in scaffold's process; torch
and safetensors are vLLM's own dependencies.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import Any


def _tensors(path: str) -> Iterator[tuple[str, Any]]:
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path} (save the checkpoint with save_pretrained)")
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - a safetensors handle is not a mapping
                yield name, handle.get_tensor(name)


class WeightLoader:
    """The worker extension: ``scaffold_load_weights(path)`` loads ``path`` into the served model."""

    model_runner: Any  # the vLLM worker's, once mixed in

    def scaffold_load_weights(self, path: str) -> int:
        """Load every tensor of the checkpoint directory ``path``; return how many were read."""
        import torch

        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in _tensors(path):
                count += 1
                yield item

        model.load_weights(weights=counted())  # the model's own loader: names mapped, tensors sharded per rank
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return count
