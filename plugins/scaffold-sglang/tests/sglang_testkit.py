"""Helpers shared by the scaffold-sglang tests and benchmark (imported as a plain module)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import sglang_test_server as ts  # noqa: E402

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


def free_port_range(size: int = 64) -> tuple[int, int]:
    """A random block of ports below the ephemeral range, so concurrent test runs rarely pick the same one."""
    from scaffold_core.distributed.ports import job_port_range

    lo, hi = job_port_range()
    start = random.randrange(lo, hi - size)
    return start, start + size - 1


def free_port() -> int:
    from scaffold_core.distributed.ports import try_reserve

    for _ in range(200):
        lo, _hi = free_port_range(1)
        reservation = try_reserve(lo, "")
        if reservation is not None:
            return reservation.release()
    raise RuntimeError("no free port found")


class ServerSubprocess:
    """The test server as a subprocess in its own process group; always stopped by the fixture."""

    def __init__(self, tmp: Path, *args: str, port: int | None = None):
        self.port = port or free_port()
        self.args = list(args)
        self.log = tmp / f"test-server-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerSubprocess:
        argv = [*SERVER_COMMAND, "--model-path", ts.DEFAULT_MODEL, "--port", str(self.port), *self.args]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"test server exited: {self.log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"test server did not listen within {timeout} s: {self.log.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


def run(coro, timeout: float = 60.0):
    """Run ``coro`` on a fresh event loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        return state != "Z"
    except OSError:
        return True
