"""Where GSM8K rows come from: the Hugging Face hub, local files, or the bundled sample.

Every source yields plain records (dicts with at least ``question`` and
``answer``); :mod:`scaffold_gsm8k.task` validates and numbers them. The
``datasets`` library is imported only when a hub or file source is read.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from scaffold_core.errors import ScaffoldError
from scaffold_core.textfiles import check_utf8

HUB_DATASET = "openai/gsm8k"
HUB_CONFIG = "main"
SAMPLE_SPLITS = ("test", "train")
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}

#: ``data_files`` as users write it: one path, a list of paths, or split -> path(s).
DataFiles = str | list[str] | dict[str, str | list[str]]


class DataSourceError(ScaffoldError):
    """The configured rows could not be read; the message says which source and how to fix it."""


# ---------------------------------------------------------------------------
# The bundled sample
# ---------------------------------------------------------------------------


def sample_path(split: str) -> Path:
    """The bundled sample file of ``split`` ("test" or "train")."""
    if split not in SAMPLE_SPLITS:
        raise ValueError(f"split {split!r} is not in the bundled sample; its splits are: {', '.join(SAMPLE_SPLITS)}")
    path = Path(str(resources.files("scaffold_gsm8k") / "data" / f"sample_{split}.jsonl"))
    if not path.is_file():
        raise DataSourceError(f"the bundled sample {path} is missing from this installation; "
                                "reinstall it with: pip install --force-reinstall scaffold-gsm8k")
    return path


def read_sample(split: str) -> list[dict[str, Any]]:
    """Records of the bundled offline sample (problems written for scaffold in GSM8K's format)."""
    path = sample_path(split)
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# ---------------------------------------------------------------------------
# Local files and the hub, through `datasets`
# ---------------------------------------------------------------------------


def files_for_split(data_files: DataFiles, split: str) -> list[str]:
    """The files of ``split``: a plain path or list serves every split; a mapping must name it."""
    if isinstance(data_files, dict):
        if split not in data_files:
            raise ValueError(
                f"data_files has no split {split!r}; it has: {', '.join(map(str, data_files)) or '(none)'}. "
                f"Add '{split}: path/to/{split}.jsonl' or set split to one of those")
        chosen = data_files[split]
    else:
        chosen = data_files
    paths = [chosen] if isinstance(chosen, str) else list(chosen)
    if not paths:
        raise ValueError(f"data_files lists no file for split {split!r}")
    return [str(p) for p in paths]


def builder_for(paths: list[str]) -> str:
    """The `datasets` builder for these files (json for .jsonl/.json, parquet for .parquet)."""
    builders = set()
    for path in paths:
        suffix = Path(path).suffix.lower()
        if suffix not in FILE_BUILDERS:
            raise ValueError(
                f"data_files: {path} is neither .jsonl, .json nor .parquet; convert it to JSON lines "
                "with 'question' and 'answer' fields")
        builders.add(FILE_BUILDERS[suffix])
    if len(builders) > 1:
        raise ValueError("data_files: mix of JSON and parquet files in one split; use one format per split")
    return builders.pop()


def check_local_files(paths: list[str]) -> None:
    """Fail early (before any model loads) on local paths that do not exist; globs and URLs pass."""
    for path in paths:
        if any(ch in path for ch in "*?[") or "://" in path:
            continue
        if not Path(path).expanduser().is_file():
            raise ValueError(f"data_files: {path} does not exist (paths are relative to the current directory)")


def read_files(data_files: DataFiles, split: str, *, cache_dir: str | None = None) -> list[dict[str, Any]]:
    """Records of ``split`` from local jsonl/parquet files, read with ``datasets``."""
    paths = files_for_split(data_files, split)
    builder = builder_for(paths)
    if builder == "json":  # a byte that is not UTF-8 is named by file, line and column, before `datasets` reads it
        for path in paths:
            local = Path(path).expanduser()
            if local.is_file():
                check_utf8(local, error=DataSourceError)
    import datasets

    try:
        dataset = datasets.load_dataset(builder, data_files={split: [str(Path(p).expanduser()) for p in paths]},
                                        split=split, cache_dir=cache_dir)
        return dataset.to_list()
    except Exception as exc:
        raise DataSourceError(
            f"task.data_files: could not read {', '.join(paths)} as {builder}: {type(exc).__name__}: {exc}. "
            "Each record needs 'question' and 'answer' fields") from exc


def read_hub(split: str, *, cache_dir: str | None = None) -> list[dict[str, Any]]:
    """Records of ``openai/gsm8k`` (config ``main``) ``split`` from the Hugging Face hub."""
    import datasets

    try:
        dataset = datasets.load_dataset(HUB_DATASET, HUB_CONFIG, split=split, cache_dir=cache_dir)
    except Exception as exc:
        raise DataSourceError(
            f"task: could not load {HUB_DATASET} ({HUB_CONFIG}, split {split!r}) from the Hugging Face hub: "
            f"{type(exc).__name__}: {exc}. Offline? Point the task at local files with "
            "'data_files: path/to/test.jsonl' (JSON lines or parquet with 'question' and 'answer' fields), "
            "or use the bundled offline sample with 'source: sample'") from exc
    return dataset.to_list()
