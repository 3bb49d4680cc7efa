"""scaffold-sglang against scaffold's conformance kit: the engine contract and what RL needs of a server engine.

The engine runs against the protocol test server (``tests/sglang_test_server.py``, SGLang's documented
``/generate`` behaviour, no GPU) with its deterministic byte backend; the real-server variant of the same
checks runs where ``SCAFFOLD_SGLANG_URL`` points at a live SGLang server (``SCAFFOLD_SGLANG_CHECKPOINT``: a
checkpoint directory that server can read, for the weight-update check).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_testkit import byte_server, ts  # noqa: E402

import scaffold_sglang  # noqa: E402
from scaffold_core.testing import BackgroundLoop, LiveEngine  # noqa: E402
from scaffold_core.testing.conformance import RemoteEngineConformance  # noqa: E402


class TestSGLangEngineConformance(RemoteEngineConformance):
    """The SGLang client engine against the protocol test server (byte tokenizer, deterministic tokens)."""

    plugin = scaffold_sglang
    name = "sglang"
    options = {"url": "http://127.0.0.1:9"}  # only for the registration and close-before-start checks
    max_tokens = 24
    _checkpoint: str | None = None

    @property
    def checkpoint(self) -> str | None:
        return type(self)._checkpoint

    @pytest.fixture(scope="class")
    @classmethod
    def live_engine(cls):
        from scaffold_sglang.engine import SGLangEngine

        cls._checkpoint = tempfile.mkdtemp(prefix="scaffold-sglang-checkpoint-")
        loop = BackgroundLoop()
        # Long answers, 2 ms a token: requests are still running when the weight-update check updates.
        running = ts.running(byte_server(context_length=4096,
                                         backend_options={"mean_tokens": 400, "token_delay_s": 0.002}))
        try:
            url = loop.run(running.__aenter__(), 30)
            # send_sampling_seed: seeded sampled requests are reproducible (the test server honours sampling_seed)
            engine = SGLangEngine(url=url, tokenizer="builtin:byte", send_sampling_seed=True)
            try:
                loop.run(engine.start(), 60)
                yield LiveEngine(engine, loop, timeout=60)
            finally:
                loop.run(engine.close(), 30)
        finally:
            try:
                loop.run(running.__aexit__(None, None, None), 30)
            finally:
                loop.close()
                shutil.rmtree(cls._checkpoint, ignore_errors=True)


@pytest.mark.skipif(not os.environ.get("SCAFFOLD_SGLANG_URL"), reason="set SCAFFOLD_SGLANG_URL to a live SGLang server")
class TestLiveSGLangEngineConformance(RemoteEngineConformance):
    """The same checks against a real SGLang server."""

    plugin = scaffold_sglang
    name = "sglang"
    max_tokens = 16
    batch_invariant = False  # GPU batching may change greedy tokens
    seeded_sampling = False  # needs the server's --enable-deterministic-inference and send_sampling_seed

    @property
    def options(self):
        return {"url": os.environ["SCAFFOLD_SGLANG_URL"]}

    @property
    def checkpoint(self):
        return os.environ.get("SCAFFOLD_SGLANG_CHECKPOINT")
