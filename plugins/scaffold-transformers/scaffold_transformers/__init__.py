"""scaffold-transformers: the embedded engine, ``transformers``, the default: any Hugging Face causal LM (or a GGUF)
run in this process, CPU or GPU, with dynamic batching, group prefill, a prefix cache, per-token weight versions
across in-place weight updates, grammar-constrained decoding (xgrammar) and logprobs equal to teacher-forced ones;
and the teacher of on-policy distillation on another checkpoint (``teacher.engine: transformers``).

The modules: ``transformers_engine`` (the engine), ``lean_llama`` (a lean batched forward for Llama-shaped models
with a KV cache of its own), ``generic_batch`` and ``prefill`` (any other model, through transformers' cache),
``kv_cache``, ``prefix_store`` (prompt prefixes kept between requests), ``weights`` (in-place weight updates),
``grammar`` (constraints), ``teacher``. Finding and loading a model, sampling and a sequence's decode state are the
core's (``scaffold_core.engines``), shared with other engines that run a model in process. torch and transformers
are imported when an engine starts, never at import time.
"""

from __future__ import annotations

from scaffold_core import hookimpl
from scaffold_core.plugins import lazy_exports

__version__ = "0.1.0"

#: The public API other plugins build on (a trainer that puts the engine beside its own model, a teacher), loaded on
#: first use. Everything else in this package is private.
PUBLIC = {"TransformersEngine": "transformers_engine", "TransformersTeacher": "teacher"}

__getattr__ = lazy_exports(__name__, PUBLIC)


@hookimpl
def register_engines(registry):
    from .transformers_engine import TransformersEngine

    registry.add("transformers", TransformersEngine)
