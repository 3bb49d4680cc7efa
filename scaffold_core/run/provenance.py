"""What produced a run: the model (name, revision, a fingerprint of its weights, tokenizer), the engine and its
options, the seed, scaffold's version, each configured component's plugin and version, and key libraries.

Versions are read from package metadata only (nothing is imported), and weights are fingerprinted from their
sizes and first and last MiB, so it is cheap and safe to call at the start and end of any command. Every run,
eval and train directory records it in ``provenance.json``; reports show it at the top.
"""

from __future__ import annotations

import hashlib
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from .._meta import CORE_DISTRIBUTION, version
from ..output.reader import PROVENANCE_FILE
from ..plugins.kinds import SECTION_KINDS

#: Libraries whose versions change what a run computes or how fast.
LIBRARIES = ("torch", "transformers", "datasets", "numpy", "trl", "sglang", "vllm")


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def components(config: dict[str, Any], registry: Any = None) -> dict[str, dict[str, Any]]:
    """section -> ``{name, plugin, distribution, version}`` for each component section of ``config``
    (its ``to_dict()`` or the saved ``config.yaml``); plugin fields are None when the name is not installed."""
    out: dict[str, dict[str, Any]] = {}
    for section, kind in SECTION_KINDS.items():
        body = config.get(section)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        entry: dict[str, Any] = {"name": body["name"], "plugin": None, "distribution": None, "version": None}
        if registry is not None:
            try:
                info = registry.get(kind, body["name"])
            except Exception:  # not installed here (a report of another machine's run)
                info = None
            if info is not None:
                dist = info.distribution or CORE_DISTRIBUTION
                entry.update(plugin=info.plugin, distribution=dist, version=_dist_version(dist))
        out[section] = entry
    return out


def versions(config: dict[str, Any] | None = None, registry: Any = None) -> dict[str, Any]:
    """scaffold's and Python's versions, the configured components' plugins, and the key libraries installed."""
    return {
        CORE_DISTRIBUTION: version(),
        "python": platform.python_version(),
        "components": components(config or {}, registry),
        "libraries": {name: v for name in LIBRARIES if (v := _dist_version(name)) is not None},
    }

#: Engine or trainer options that name the model, in the order they are looked for.
MODEL_KEYS = ("model", "model_path", "model_name", "model_name_or_path", "path", "checkpoint")
#: Weight files fingerprinted in a model directory (and the config and tokenizer files next to them).
WEIGHT_PATTERNS = ("*.safetensors", "*.gguf", "*.bin", "*.pt", "*.pth", "config.json", "tokenizer.json",
                   "tokenizer.model")
#: Bytes read at each end of a file to fingerprint it (with its size): cheap for a many-gigabyte model.
FINGERPRINT_CHUNK = 1 << 20
#: At most this many files of a model directory are fingerprinted.
MAX_FINGERPRINT_FILES = 64


def file_fingerprint(path: Path) -> str:
    """``sha256`` over a file's size and its first and last MiB: changes when the weights do, read in
    milliseconds whatever the file's size (a full hash of a 15 GB model would take a minute)."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    digest.update(str(size).encode())
    with path.open("rb") as fh:
        digest.update(fh.read(FINGERPRINT_CHUNK))
        if size > FINGERPRINT_CHUNK:
            fh.seek(max(FINGERPRINT_CHUNK, size - FINGERPRINT_CHUNK))
            digest.update(fh.read(FINGERPRINT_CHUNK))
    return digest.hexdigest()


def weights_fingerprint(location: str | Path) -> dict[str, Any] | None:
    """``{path, bytes, files, fingerprint, method}`` for a local weights file or model directory, else None
    (a hub id, or a path not on this machine)."""
    path = Path(location).expanduser()
    try:
        if path.is_file():
            files = [path]
        elif path.is_dir():
            files = sorted({f for pattern in WEIGHT_PATTERNS for f in path.glob(pattern) if f.is_file()})
            files = files[:MAX_FINGERPRINT_FILES]
        else:
            return None
        if not files:
            return None
        digest = hashlib.sha256()
        total = 0
        for f in files:
            total += f.stat().st_size
            digest.update(f.name.encode() + b"\0" + file_fingerprint(f).encode())
    except OSError:
        return None
    return {"path": str(path.resolve()), "files": len(files), "bytes": total, "fingerprint": digest.hexdigest()[:16],
            "method": "sha256 of each file's size, first and last MiB"}


def _option(body: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(body, dict):
        return None
    for key in keys:
        if isinstance(body.get(key), str) and body[key]:
            return body[key]
    return None


def model_provenance(config: dict[str, Any], engine: Any = None) -> dict[str, Any]:
    """What model a run used: ``{name, revision, tokenizer, weights}`` from the engine's (else the trainer's)
    options, or from the running engine when it resolved a default (its ``source``); ``weights``: the local
    file's fingerprint (:func:`weights_fingerprint`), None for a hub id."""
    engine_opts, trainer_opts = config.get("engine"), config.get("trainer")
    name = _option(engine_opts, MODEL_KEYS) or _option(trainer_opts, ("policy", *MODEL_KEYS))
    source = getattr(engine, "source", None) if engine is not None else None
    if source is None and name is None and isinstance(engine_opts, dict) and engine_opts.get("name") == "transformers":
        from ..engines.model_loading import resolve_model  # no engine here (a training run): its default model

        source = resolve_model(None)
    location = name
    if source is not None and getattr(source, "location", None):
        location = str(Path(source.location) / source.gguf_file) if getattr(source, "gguf_file", None) \
            else str(source.location)
        name = name or getattr(source, "label", location)
    tokenizer = _option(engine_opts, ("tokenizer", "tokenizer_path")) or _option(trainer_opts, ("tokenizer",))
    if tokenizer is None and engine is not None:
        tokenizer = getattr(getattr(engine, "tokenizer", None), "name_or_path", None) or None
    return {"name": name or "(the engine's default)",
            "revision": _option(engine_opts, ("revision",)) or _option(trainer_opts, ("revision",)),
            "tokenizer": tokenizer or name, "weights": weights_fingerprint(location) if location else None}


def provenance(config: dict[str, Any], registry: Any = None, engine: Any = None) -> dict[str, Any]:
    """Everything that says what produced a run: the model (name, revision, weights fingerprint, tokenizer),
    the engine and its options, the seed, and the versions of scaffold, its plugins and key libraries."""
    section = config.get("engine")
    engine_section: dict[str, Any] = section if isinstance(section, dict) else {}
    options = {k: v for k, v in engine_section.items() if k != "name"}
    return {
        "model": model_provenance(config, engine),
        "engine": {"name": engine_section.get("name"), "options": options,
                   "defaults": _defaults(registry, engine_section.get("name"), options)},
        "seed": (config.get("sampling") or {}).get("seed"),
        "versions": versions(config, registry),
    }


def _defaults(registry: Any, name: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The options the engine ``name`` declares that the config leaves at their defaults (plain values only)."""
    if registry is None or not isinstance(name, str):
        return {}
    from ..plugins import option_table

    try:
        table = option_table(registry.get("engine", name).factory)
    except Exception:  # not installed here, or a factory without a readable signature
        return {}
    plain = (type(None), bool, int, float, str)
    return {o.name: o.default for o in table
            if o.name not in given and o.default is not ... and isinstance(o.default, plain)}


def write_provenance(directory: str | Path, config: dict[str, Any], *, registry: Any = None, engine: Any = None,
                     private: bool = True) -> dict[str, Any]:
    """Write ``provenance.json`` into ``directory``; returns what it wrote. Never fails the run: a record that
    cannot be written is warned about."""
    import json
    import sys

    from ..output.files import atomic_write_text

    record = provenance(config, registry, engine)
    try:
        atomic_write_text(Path(directory) / PROVENANCE_FILE, json.dumps(record, indent=2, default=str) + "\n",
                          private=private)
    except OSError as exc:
        print(f"scaffold: WARNING: {PROVENANCE_FILE} could not be written ({exc})", file=sys.stderr)
    return record
