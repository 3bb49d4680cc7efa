"""Helpers shared by the scaffold-vllm tests and benchmarks (imported as a plain module)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import vllm_test_server as ts  # noqa: E402
from scaffold_testkit.remote_server import ServerSubprocess as _ServerSubprocess  # noqa: E402
from scaffold_testkit.remote_server import free_port, free_port_range, pid_alive, run  # noqa: E402, F401
from scaffold_vllm import VLLMEngine  # noqa: E402

from scaffold_core.generation import GenerationRequest  # noqa: E402
from scaffold_core.sampling import SamplingParams  # noqa: E402

SERVER_SCRIPT = HERE / "vllm_test_server.py"
#: The launcher's command prefix that starts the test server instead of `vllm serve`.
SERVER_COMMAND = [sys.executable, str(SERVER_SCRIPT), "serve"]
BYTE_VOCAB = ["--vocab-size", "262"]  # token ids the byte tokenizer can decode


def byte_backend(**kw: Any) -> ts.RandomBackend:
    """A random backend whose token ids all decode with scaffold's ByteTokenizer (vocab 262, EOS 2)."""
    opts: dict[str, Any] = dict(vocab_size=262, eos_token_id=2, mean_tokens=8, token_delay_s=0.0, seed=0)
    opts.update(kw)
    return ts.RandomBackend(**opts)


def byte_server(**kw: Any) -> ts.TestServer:
    """An in-process test server over the byte tokenizer, its development routes on (as engine.launch starts)."""
    backend = kw.pop("backend", None) or byte_backend(**kw.pop("backend_options", {}))
    kw.setdefault("tokenizer_path", "builtin:byte")
    kw.setdefault("dev_mode", True)
    return ts.TestServer(backend=backend, **kw)


def engine(url: str, **kw: Any) -> VLLMEngine:
    kw.setdefault("tokenizer", "builtin:byte")
    kw.setdefault("retry_backoff", 0.01)
    return VLLMEngine(url=url, **kw)


def req(i: int | str = 0, *, prompt: list[int] | None = None, episode: str | None = None, seed: int | None = None,
        **sampling: Any) -> GenerationRequest:
    sp = SamplingParams(**{"max_tokens": 16, "temperature": 0.0, **sampling})
    return GenerationRequest(f"req-{i}", prompt or [40 + sum(map(ord, str(i))) % 50, 41, 42], sp, seed=seed,
                             episode_id=episode or f"ep-{i}")


class ServerSubprocess(_ServerSubprocess):
    """The vLLM test server as a subprocess, development routes on; always stopped by the fixture."""

    def __init__(self, tmp: Path, *args: str, port: int | None = None):
        super().__init__(tmp, SERVER_COMMAND, ts.DEFAULT_MODEL, *args, port=port,
                         env={"VLLM_SERVER_DEV_MODE": "1"})
