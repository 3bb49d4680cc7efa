"""Built-in engines: ``transformers`` (the embedded default) and ``benchmark_canned`` (benchmarks only).

The engine modules import torch and transformers inside ``start()``, so
registering them here costs nothing at start-up.
"""

from __future__ import annotations

from ..engines.canned import CannedBenchmarkEngine
from ..engines.transformers_engine import TransformersEngine
from ..plugins.markers import hookimpl


@hookimpl
def register_engines(registry):
    registry.add("transformers", TransformersEngine)
    registry.add("benchmark_canned", CannedBenchmarkEngine)
