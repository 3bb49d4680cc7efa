"""scaffold-sglang against scaffold's conformance kit: the engine contract and what RL needs of a server engine.

The engine runs against the protocol test server (``tests/sglang_test_server.py``, SGLang's documented
``/generate`` behaviour, no GPU) with its deterministic byte backend; the real-server variant of the same
checks runs where ``SCAFFOLD_SGLANG_URL`` points at a live SGLang server (``SCAFFOLD_SGLANG_CHECKPOINT``: a
checkpoint directory that server can read, for the weight-update check).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scaffold_testkit.conformance import RemoteEngineConformance  # noqa: E402
from scaffold_testkit.remote_server import serve_engine_in_process  # noqa: E402
from sglang_testkit import byte_server  # noqa: E402

import scaffold_sglang  # noqa: E402


class TestSGLangEngineConformance(RemoteEngineConformance):
    """The SGLang client engine against the protocol test server (byte tokenizer, deterministic tokens)."""

    plugin = scaffold_sglang
    name = "sglang"
    options = {"url": "http://127.0.0.1:9"}  # only for the registration and close-before-start checks
    max_tokens = 24

    @pytest.fixture(scope="class")
    @classmethod
    def live_engine(cls, tmp_path_factory):
        from scaffold_sglang.engine import SGLangEngine

        cls._checkpoint = str(tmp_path_factory.mktemp("checkpoint"))
        # Long answers, 2 ms a token: requests are still running when the weight-update check updates.
        server = byte_server(context_length=4096, backend_options={"mean_tokens": 400, "token_delay_s": 0.002})
        # send_sampling_seed: seeded sampled requests are reproducible (the test server honours sampling_seed)
        yield from serve_engine_in_process(
            server, lambda url: SGLangEngine(url=url, tokenizer="builtin:byte", send_sampling_seed=True))


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
