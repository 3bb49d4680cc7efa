"""How SGLang servers start (``engine.launch``): ``python -m sglang.launch_server`` and its flags.

The launching itself (ports from the worker's slice, process groups, logs,
readiness, stopping) is the shared launcher's
(:mod:`scaffold_remote.launcher`); this module says only what is
SGLang's: the command, ``--port`` and ``--nccl-port`` (both from the slice),
``--tp-size``, ``--base-gpu-id`` so servers of one host use distinct GPUs,
and the flags scaffold sets itself.
"""

from __future__ import annotations

import sys
from typing import ClassVar

from scaffold_remote.launcher import LaunchError, LaunchOptions, ServerSpec, live_servers

from scaffold_core.errors import require_module

__all__ = ["LaunchError", "SGLangLaunchOptions", "SGLangServer", "live_servers"]

DEFAULT_COMMAND = ("-m", "sglang.launch_server")  # after sys.executable


class SGLangLaunchOptions(LaunchOptions):
    """``engine.launch`` of the sglang engine."""

    managed_flags: ClassVar[dict[str, str]] = {
        "--model-path": "engine.launch.model_path", "--model": "engine.launch.model_path",
        "--host": "engine.launch.host", "--port": "the worker's port range (ports are assigned)",
        "--nccl-port": "the worker's port range (ports are assigned)",
        "--tp-size": "engine.launch.tp", "--tp": "engine.launch.tp", "--tensor-parallel-size": "engine.launch.tp",
        "--api-key": "engine.launch.use_api_key with the key in the engine.api_key_env variable",
    }


class SGLangServer(ServerSpec):
    """``python -m sglang.launch_server --model-path M --host H --port P --nccl-port N --tp-size T ...``."""

    name = "sglang"
    ports_per_server = 2  # HTTP, NCCL

    def command_prefix(self, options: LaunchOptions) -> list[str]:
        require_module("sglang", needed_by=f"engine.launch (it starts SGLang servers with {sys.executable})",
                       load=False, install='pip install "scaffold-sglang[server]" (on a GPU machine), or start the '
                                           "servers yourself and set engine.url instead")
        return [sys.executable, *DEFAULT_COMMAND]

    def argv(self, options: LaunchOptions, prefix: list[str], index: int, host: str, ports: list[int],
             gpus: list[int], api_key: str | None) -> list[str]:
        args = [*prefix, "--model-path", options.model_path, "--host", host, "--port", str(ports[0]),
                "--nccl-port", str(ports[1]), "--tp-size", str(options.tp)]
        if options.assign_gpus and not any(a.split("=", 1)[0] == "--base-gpu-id" for a in options.extra_args):
            args += ["--base-gpu-id", str(gpus[0])]
        if api_key is not None:
            args += ["--api-key", api_key]
        return args + list(options.extra_args)


def tokenizer_flag(extra_args: list[str]) -> str | None:
    """The value of ``--tokenizer-path`` among SGLang's extra arguments (it wins over the model path)."""
    for i, arg in enumerate(extra_args):
        if arg == "--tokenizer-path" and i + 1 < len(extra_args):
            return extra_args[i + 1]
        if arg.startswith("--tokenizer-path="):
            return arg.split("=", 1)[1]
    return None

