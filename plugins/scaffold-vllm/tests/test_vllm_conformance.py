"""scaffold-vllm against scaffold's conformance kit: the engine contract and what RL needs of a server engine.

The same checks run against the protocol test server (``tests/vllm_test_server.py``, vLLM's documented
behaviour, no GPU) and, where ``SCAFFOLD_VLLM_URL`` points at one, against a live vLLM server
(``SCAFFOLD_VLLM_CHECKPOINT``: a checkpoint directory that server can read, for the weight-update check).
"""

from __future__ import annotations

import os

import pytest
import scaffold_vllm
from scaffold_testkit.conformance import RemoteEngineConformance
from scaffold_testkit.remote_server import serve_engine_in_process
from vllm_testkit import byte_server


class TestVLLMEngineConformance(RemoteEngineConformance):
    """The vLLM client engine against the protocol test server (byte tokenizer, deterministic tokens)."""

    plugin = scaffold_vllm
    name = "vllm"
    options = {"url": "http://127.0.0.1:9"}  # only for the registration and close-before-start checks
    max_tokens = 24

    @pytest.fixture(scope="class")
    @classmethod
    def live_engine(cls, tmp_path_factory):
        from scaffold_vllm.engine import VLLMEngine

        cls._checkpoint = str(tmp_path_factory.mktemp("checkpoint"))
        # Long answers, 2 ms a token: requests are still running when the weight-update check updates.
        server = byte_server(context_length=4096, backend_options={"mean_tokens": 400, "token_delay_s": 0.002})
        yield from serve_engine_in_process(server, lambda url: VLLMEngine(url=url, tokenizer="builtin:byte"))


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
