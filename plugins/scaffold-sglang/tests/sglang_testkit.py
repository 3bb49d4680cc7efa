"""Helpers shared by the scaffold-sglang tests and benchmark (imported as a plain module)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import sglang_test_server as ts  # noqa: E402
from scaffold_testkit.remote_server import (  # noqa: E402
    ServerSubprocess as _ServerSubprocess,
)
from scaffold_testkit.remote_server import free_port, free_port_range, pid_alive, run  # noqa: E402, F401

SERVER_SCRIPT = HERE / "sglang_test_server.py"
#: The launcher's command prefix that starts the test server instead of sglang.launch_server.
SERVER_COMMAND = [sys.executable, str(SERVER_SCRIPT)]


def byte_backend(**kw) -> ts.RandomBackend:
    """A random backend whose token ids all decode with scaffold's ByteTokenizer (vocab 262, EOS 2)."""
    opts = dict(vocab_size=262, eos_token_id=2, mean_tokens=8, token_delay_s=0.0, seed=0)
    opts.update(kw)
    return ts.RandomBackend(**opts)


def byte_server(**kw) -> ts.TestServer:
    backend = kw.pop("backend", None) or byte_backend(**kw.pop("backend_options", {}))
    kw.setdefault("tokenizer_path", "builtin:byte")
    return ts.TestServer(backend=backend, **kw)


class ServerSubprocess(_ServerSubprocess):
    """The SGLang test server as a subprocess (``--model-path`` set); always stopped by the fixture."""

    def __init__(self, tmp: Path, *args: str, port: int | None = None):
        super().__init__(tmp, SERVER_COMMAND, "--model-path", ts.DEFAULT_MODEL, *args, port=port)
