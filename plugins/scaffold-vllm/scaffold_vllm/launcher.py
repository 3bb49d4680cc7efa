"""How vLLM servers start (``engine.launch``): ``vllm serve`` and its flags.

The launching itself (ports from the worker's slice, process groups, logs,
readiness, stopping) is the shared launcher's
(:mod:`scaffold_remote.launcher`); this module says only what is vLLM's:

* the command: ``python -m vllm.entrypoints.cli.main serve <model>`` (the
  ``vllm serve`` console script, run by this Python), ``--host``,
  ``--port`` and ``--tensor-parallel-size``;
* two ports per server from the slice: the HTTP port, and ``VLLM_PORT``,
  where vLLM starts counting the ports it opens for itself (its
  torch.distributed rendezvous), so servers of different workers never
  race for the same internal port;
* ``CUDA_VISIBLE_DEVICES``: vLLM has no base-GPU flag, so each server of a
  host sees only its own ``tp`` GPUs (taken from the launcher's own
  ``CUDA_VISIBLE_DEVICES`` when it has one);
* ``VLLM_SERVER_DEV_MODE=1``: the pause, resume and weight endpoints are
  vLLM's development routes;
* ``--worker-extension-cls scaffold_vllm.worker_extension.WeightLoader``:
  what loads a checkpoint directory into the running model
  (``update_weights('/path')``), or, with ``weight_sync: transfer``,
  ``--weight-transfer-config '{"backend": "disk"}'``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import ClassVar

from scaffold_remote.launcher import LaunchOptions, ServerSpec

from scaffold_core.errors import require_module

COMMAND = ("-m", "vllm.entrypoints.cli.main", "serve")  # after sys.executable
WORKER_EXTENSION = "scaffold_vllm.worker_extension.WeightLoader"


class VLLMLaunchOptions(LaunchOptions):
    """``engine.launch`` of the vllm engine."""

    managed_flags: ClassVar[dict[str, str]] = {
        "--model": "engine.launch.model_path", "--host": "engine.launch.host",
        "--port": "the worker's port range (ports are assigned)",
        "--tensor-parallel-size": "engine.launch.tp", "-tp": "engine.launch.tp",
        "--api-key": "engine.launch.use_api_key with the key in the engine.api_key_env variable",
    }


def flag_value(args: list[str], *names: str) -> str | None:
    """The value of the first of ``names`` in ``args`` (``--flag value`` or ``--flag=value``), else None."""
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


class VLLMServer(ServerSpec):
    """``vllm serve M --host H --port P --tensor-parallel-size T --worker-extension-cls ... [extra args]``."""

    name = "vllm"
    ports_per_server = 2  # HTTP, and the base of the ports vLLM opens for itself (VLLM_PORT)

    def __init__(self, worker_extension: bool = True, weight_transfer: str | None = None):
        self.worker_extension = worker_extension
        self.weight_transfer = weight_transfer  # a weight-transfer backend to start with (e.g. "disk")

    def command_prefix(self, options: LaunchOptions) -> list[str]:
        require_module("vllm", needed_by=f"engine.launch (it starts vLLM servers with {sys.executable})",
                       load=False, install='pip install "scaffold-vllm[server]" (on a GPU machine), or start the '
                                           "servers yourself and set engine.url instead")
        return [sys.executable, *COMMAND]

    def argv(self, options: LaunchOptions, prefix: list[str], index: int, host: str, ports: list[int],
             gpus: list[int], api_key: str | None) -> list[str]:
        args = [*prefix, options.model_path, "--host", host, "--port", str(ports[0]),
                "--tensor-parallel-size", str(options.tp)]
        if self.worker_extension and flag_value(options.extra_args, "--worker-extension-cls") is None:
            args += ["--worker-extension-cls", WORKER_EXTENSION]
        if self.weight_transfer and flag_value(options.extra_args, "--weight-transfer-config") is None:
            args += ["--weight-transfer-config", json.dumps({"backend": self.weight_transfer})]
        if api_key is not None:
            args += ["--api-key", api_key]
        return args + list(options.extra_args)

    def env(self, options: LaunchOptions, index: int, ports: list[int], gpus: list[int]) -> dict[str, str]:
        env = {"VLLM_PORT": str(ports[1]), "VLLM_SERVER_DEV_MODE": "1"}
        if options.assign_gpus:
            visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[g] if g < len(visible) else str(g) for g in gpus)
        return env
