"""The engine conformance kit run against the embedded ``transformers`` engine on SmolLM2.

Kept apart from test_conformance_builtins.py: the files that use the shared model run on one pytest-xdist
worker (conftest.py), and the other built-ins' conformance runs need no model.
"""

from __future__ import annotations

import pytest
from scaffold_testkit.conformance import EngineConformance


@pytest.mark.model
class TestTransformersEngine(EngineConformance):
    """The embedded engine on SmolLM2, sharing the session's model engine (few, short requests)."""

    name = "transformers"
    max_tokens = 8
    prompts = ("Name three colours.", "Count from one to twenty in words, separated by commas.")

    @pytest.fixture(scope="class")
    @classmethod
    def live_engine(cls, smollm2_engine):
        return smollm2_engine
