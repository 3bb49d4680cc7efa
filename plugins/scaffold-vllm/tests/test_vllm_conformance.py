"""scaffold-vllm against scaffold's conformance kit: the engine contract and what RL needs of a server engine.

The same checks run against the protocol test server (``tests/vllm_test_server.py``, vLLM's documented
behaviour, no GPU) and, where ``SCAFFOLD_VLLM_URL`` points at one, against a live vLLM server
(``SCAFFOLD_VLLM_CHECKPOINT``: a checkpoint directory that server can read, for the weight-update check).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import scaffold_vllm
from vllm_testkit import byte_server, ts

from scaffold_core.testing import BackgroundLoop, LiveEngine
from scaffold_core.testing.conformance import RemoteEngineConformance


class TestVLLMEngineConformance(RemoteEngineConformance):
    """The vLLM client engine against the protocol test server (byte tokenizer, deterministic tokens)."""

    plugin = scaffold_vllm
    name = "vllm"
    options = {"url": "http://127.0.0.1:9"}  # only for the registration and close-before-start checks
    max_tokens = 24
    _checkpoint: str | None = None

    @property
    def checkpoint(self) -> str | None:
        return type(self)._checkpoint

    @pytest.fixture(scope="class")
    @classmethod
    def live_engine(cls):
        from scaffold_vllm.engine import VLLMEngine

        cls._checkpoint = tempfile.mkdtemp(prefix="scaffold-vllm-checkpoint-")
        loop = BackgroundLoop()
        # Long answers, 2 ms a token: requests are still running when the weight-update check updates.
        server = byte_server(context_length=4096, backend_options={"mean_tokens": 400, "token_delay_s": 0.002})
        running = ts.running(server)
        try:
            url = loop.run(running.__aenter__(), 30)
            engine = VLLMEngine(url=url, tokenizer="builtin:byte")
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


@pytest.mark.skipif(not os.environ.get("SCAFFOLD_VLLM_URL"), reason="set SCAFFOLD_VLLM_URL to a live vLLM server")
class TestLiveVLLMEngineConformance(RemoteEngineConformance):
    """The same checks against a real vLLM server."""

    plugin = scaffold_vllm
    name = "vllm"
    max_tokens = 16
    batch_invariant = False  # GPU batching may change greedy tokens

    @property
    def options(self):
        return {"url": os.environ["SCAFFOLD_VLLM_URL"]}

    @property
    def checkpoint(self):
        return os.environ.get("SCAFFOLD_VLLM_CHECKPOINT")
