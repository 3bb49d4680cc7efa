"""Files derived from the ledger at the end of a run: samples, failures and the trajectories dataset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .files import atomic_writer, fresh_dir, replace_dir, set_tree_modes


def write_derived(directory: Path, records: dict[str, dict[str, Any]], *, save_dataset: bool = True,
                  private: bool = True) -> dict[str, int]:
    """Write samples.jsonl, failures.jsonl and the trajectories dataset from ledger records (each to a
    fresh temp name renamed into place: never through a link)."""
    ordered = sorted(records.values(), key=lambda r: (r.get("index", 0), r["episode_id"]))
    n_samples = n_failed = n_traj = 0
    with atomic_writer(directory / "samples.jsonl", private=private, durable=False) as fs, \
            atomic_writer(directory / "failures.jsonl", private=private, durable=False) as ff:
        for rec in ordered:
            if rec["status"] != "ok":
                n_failed += 1
                ff.write(json.dumps({k: rec.get(k) for k in ("episode_id", "index", "error_component", "error",
                                                             "attempts", "answer")}, ensure_ascii=False) + "\n")
                continue
            for s in rec["samples"]:
                n_samples += 1
                fs.write(json.dumps({
                    "episode_id": rec["episode_id"], "sample_index": s["sample_index"], "prompt": rec["prompt"],
                    "response": s["response"], "answer": rec["answer"], "extracted": s["extracted"],
                    "reward": s["reward"], "reason": s["reason"], "finish_reason": s["finish_reason"],
                    "generated_tokens": s["generated_tokens"],
                    "chosen": rec.get("chosen") == s["sample_index"] if rec.get("chosen") is not None else None,
                    **({"turn_rewards": s["turn_rewards"]} if "turn_rewards" in s else {}),
                }, ensure_ascii=False) + "\n")
            n_traj += len(rec.get("trajectories") or [])
    if save_dataset:
        save_trajectories(directory, ordered, private=private)
    return {"samples": n_samples, "failed": n_failed, "trajectories": n_traj}


_SCALAR_TYPES = ((bool, "bool"), (int, "int64"), (float, "float32"), (str, "string"))


def _value_type(value: Any) -> str | None:
    """The dataset type of one value: a scalar type, ``list:int64``/``list:float32``, or None (no column)."""
    if isinstance(value, (list, tuple)):
        inner = {_value_type(v) for v in value}
        if inner <= {"int64"}:
            return "list:int64"
        return "list:float32" if inner <= {"int64", "float32"} else None
    return next((name for cls, name in _SCALAR_TYPES if isinstance(value, cls)), None)


def extra_features(rows: list[dict[str, Any]], known: Any) -> dict[str, Any]:
    """Dataset columns for keys a trajectory maker adds beyond the standard ones (e.g. a multi-turn
    maker's ``turn_rewards``): numbers, strings, booleans and lists of numbers are kept; other
    values stay in ``episodes.jsonl`` only."""
    import datasets

    found: dict[str, set[str | None]] = {}
    for row in rows:
        for key, value in row.items():
            if key not in known and value is not None:
                found.setdefault(key, set()).add(_value_type(value))
    out: dict[str, Any] = {}
    for key, types in found.items():
        if None in types:
            continue
        if types <= {"list:int64", "list:float32"}:
            out[key] = datasets.Sequence(datasets.Value("float32" if "list:float32" in types else "int64"))
        elif types <= {"int64", "float32"}:
            out[key] = datasets.Value("float32" if "float32" in types else "int64")
        elif len(types) == 1:
            out[key] = datasets.Value(next(iter(types)))
    return out


def save_trajectories(directory: Path, ordered: list[dict[str, Any]], *, private: bool = True) -> None:
    """Save the training sequences with ``datasets`` (load with ``datasets.load_from_disk``)."""
    import datasets

    rows = [t for rec in ordered if rec["status"] == "ok" for t in (rec.get("trajectories") or [])]
    features = datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("int64")),
        "loss_mask": datasets.Sequence(datasets.Value("int8")),
        "logprobs": datasets.Sequence(datasets.Value("float32")),
        "versions": datasets.Sequence(datasets.Value("int32")),
        "reward": datasets.Value("float32"),
        "advantage": datasets.Value("float32"),
        "episode_id": datasets.Value("string"),
        "sample_index": datasets.Value("int32"),
        "group_id": datasets.Value("string"),
        "prompt_len": datasets.Value("int32"),
        "finish_reason": datasets.Value("string"),
    })
    features.update(extra_features(rows, features))
    columns = {name: [row.get(name) for row in rows] for name in features}
    dataset = datasets.Dataset.from_dict(columns, features=features)
    tmp = fresh_dir(directory, "trajectories", private=private)
    quiet = not datasets.are_progress_bars_disabled()
    if quiet:
        datasets.disable_progress_bars()  # the run has its own progress bar; this one is noise
    try:
        dataset.save_to_disk(str(tmp))
        set_tree_modes(tmp, private=private)
        replace_dir(tmp, directory / "trajectories")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if quiet:
            datasets.enable_progress_bars()
