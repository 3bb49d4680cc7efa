"""The text of each token id a report shows, from the run's tokenizer.

At the end of ``scaffold run``/``eval`` the engine's tokenizer is at hand and
is used as it is. ``scaffold report DIR`` on its own finds one from the saved
config: the engine component's tokenizer when it has one without starting
(the byte tokenizer of test and benchmark engines), else a Hugging Face
tokenizer for the engine's ``model`` (the converted-model cache of the
embedded engine first, so nothing is downloaded), else none: the report then
shows token ids instead of their text, and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("scaffold.report")


def token_texts(tokenizer: Any, ids: Iterable[int]) -> dict[int, str]:
    """id -> the text of that one token (special tokens included), for each distinct id."""
    unique = sorted(set(ids))
    if tokenizer is None or not unique:
        return {}
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's own: ten times faster
    batch = getattr(tokenizer, "batch_decode", None)
    try:
        if backend is not None and hasattr(backend, "decode_batch"):
            texts = backend.decode_batch([[i] for i in unique], skip_special_tokens=False)
        elif batch is not None:
            texts = batch([[i] for i in unique], skip_special_tokens=False)
        else:
            texts = [tokenizer.decode([i]) for i in unique]
    except Exception as exc:  # a tokenizer that cannot decode some id: ids are shown instead
        log.warning("the tokenizer could not decode the report's tokens (%s: %s); showing ids",
                    type(exc).__name__, exc)
        return {}
    return {i: str(t) for i, t in zip(unique, texts)}


def tokenizer_for_run(config: dict[str, Any] | None, registry: Any = None) -> tuple[Any, str]:
    """(a tokenizer for the run's token ids or None, where it came from or why there is none)."""
    engine = (config or {}).get("engine")
    if not isinstance(engine, dict) or not isinstance(engine.get("name"), str):
        return None, "the run saved no engine in config.yaml"
    options = {k: v for k, v in engine.items() if k != "name"}
    component = None
    if registry is not None:
        try:
            component = registry.create("engine", engine["name"], options, path="engine")
        except Exception as exc:
            return None, f"engine {engine['name']!r} could not be built here ({exc})"
    tokenizer = getattr(component, "tokenizer", None)
    if tokenizer is not None:
        return tokenizer, f"the {engine['name']} engine's tokenizer"
    model = getattr(component, "source", None)
    if model is None and isinstance(options.get("model"), str):
        model = options["model"]
    if model is None and engine["name"] != "transformers":
        return None, f"engine {engine['name']!r} has no tokenizer before it starts; pass --tokenizer"
    return _hf_tokenizer(model)


def _hf_tokenizer(model: Any) -> tuple[Any, str]:
    """A Hugging Face tokenizer for an engine's model (a ModelSource, a name or a path), offline."""
    from scaffold_core.engines.model_loading import ModelSource, cached_model_dir, resolve_model

    try:
        source = model if isinstance(model, ModelSource) else resolve_model(model)
        from transformers import AutoTokenizer
    except Exception as exc:
        return None, f"no tokenizer ({type(exc).__name__}: {exc})"
    location, kwargs = source.location, {}
    if source.gguf_file:
        cached = cached_model_dir(source)
        if cached is not None:
            location = str(cached)
        else:
            kwargs = {"gguf_file": source.gguf_file}
    name = source.gguf_file or source.location
    try:
        return AutoTokenizer.from_pretrained(location, local_files_only=True, **kwargs), f"the tokenizer of {name}"
    except Exception as exc:
        return None, f"no tokenizer for {name} ({type(exc).__name__}: {exc}); pass --tokenizer"


def load_tokenizer(name: str) -> Any:
    """``--tokenizer NAME``: a Hugging Face tokenizer by local path or cached hub id."""
    from scaffold_core.errors import ConfigError

    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:
        raise ConfigError(f"--tokenizer {name}: cannot load it ({type(exc).__name__}: {exc}); give a local "
                          "tokenizer folder or a model folder") from None
