"""Built-in engine: ``benchmark_canned`` (benchmarks and tests: a canned answer, no model). The embedded
transformers engine is a default plugin of its own (docs/plugins.md)."""

from __future__ import annotations

from ..engines.canned import CannedBenchmarkEngine
from ..plugins.markers import hookimpl


@hookimpl
def register_engines(registry):
    registry.add("benchmark_canned", CannedBenchmarkEngine)
