"""A run's output directory: crash-safe episode ledger, derived files, atomic metadata.

Files (see docs/reliability.md for the guarantees):

* ``episodes.jsonl``: the ledger. One line per finished episode (completed or
  failed), appended with a single ``write`` as the episode finishes, holding
  its samples and training sequences. A killed run loses at most the episodes
  in flight; ``--resume`` skips every completed episode found here.
* ``samples.jsonl``: one line per sample: prompt, response, reference answer
  (``answer``), extracted answer, reward, finish reason. ``scaffold score``
  can re-score it as is.
* ``failures.jsonl``: one line per failed episode with the component and reason.
* ``trajectories/``: the training sequences as a Hugging Face dataset
  (``datasets.load_from_disk(dir + "/trajectories")``).
* ``metrics.json`` and ``config.yaml``: written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .episode import EpisodeResult
from .errors import ConfigError

LEDGER = "episodes.jsonl"
#: Per-worker ledgers of multi-worker runs: ``episodes.rank-00003.jsonl`` (see scaffold_core.workers).
RANK_LEDGER_GLOB = "episodes.rank-*.jsonl"
#: Files and folders a run writes; ``overwrite`` removes only these (and rank ledgers), never anything else.
RUN_FILES = (LEDGER, "samples.jsonl", "failures.jsonl", "trajectories", "metrics.json", "config.yaml", "workers")


def rank_ledger_name(rank: int) -> str:
    """The ledger file of worker ``rank`` in a multi-worker run."""
    return f"episodes.rank-{rank:05d}.jsonl"


def ledger_paths(directory: str | Path) -> list[Path]:
    """Every ledger of the run in ``directory``: ``episodes.jsonl`` and the rank ledgers, in rank order."""
    root = Path(directory)
    paths = [root / LEDGER] if (root / LEDGER).exists() else []
    return paths + sorted(root.glob(RANK_LEDGER_GLOB))


def run_files(directory: str | Path) -> list[str]:
    """Names of the run files present in ``directory``."""
    root = Path(directory)
    names = [name for name in RUN_FILES if (root / name).exists()]
    return names + [p.name for p in sorted(root.glob(RANK_LEDGER_GLOB))]


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def safe_child(root: Path, name: str) -> Path:
    """``root / name``, refusing names that would escape ``root``."""
    child = (root / name).resolve()
    if root.resolve() not in (child, *child.parents):
        raise ValueError(f"output path {name!r} escapes the output directory {root}")
    return child


def record_of(result: EpisodeResult) -> dict[str, Any]:
    """The ledger line of one episode."""
    samples = []
    for s in result.samples:
        v = s.verdict
        samples.append({
            "sample_index": s.sample_index,
            "response": s.text,
            "extracted": v.extracted if v else None,
            "key": v.key if v else None,
            "reward": v.reward if v else None,
            "reason": v.reason if v else None,
            "finish_reason": s.finish_reason,
            "prompt_tokens": len(s.prompt_ids),
            "generated_tokens": s.generated_tokens,
            "weight_version": s.weight_version,
            **({"turn_rewards": s.turn_rewards} if s.turn_rewards is not None else {}),
            **({"metadata": s.metadata} if s.metadata else {}),
        })
    return {
        "episode_id": result.episode_id,
        "index": result.index,
        "status": result.status,
        "error": result.error,
        "error_component": result.error_component,
        "attempts": result.attempts,
        "wall_s": round(result.wall_s, 6),
        "prompt": result.prompt_text,
        "answer": result.reference,
        "final_answer": result.answer,
        "answer_reward": result.answer_reward,
        "chosen": result.chosen,
        "metrics": result.metrics,
        "samples": samples,
        "trajectories": [t.to_dict() for t in result.trajectories],
    }


def result_of(record: dict[str, Any]) -> EpisodeResult:
    """A light EpisodeResult rebuilt from a ledger line (enough for metrics)."""
    from .episode import Sample
    from .verifier import Verdict

    samples = []
    for s in record.get("samples", []):
        verdict = None if s.get("reward") is None else Verdict(s["reward"], s.get("extracted"), s.get("key"),
                                                               s.get("reason") or "")
        n = int(s.get("generated_tokens", 0))
        samples.append(Sample([], [0] * n, [0.0] * n, [1] * n, s.get("response", ""), s.get("finish_reason", ""),
                              s.get("sample_index", 0), s.get("weight_version"), verdict))
    return EpisodeResult(
        episode_id=record["episode_id"], index=record.get("index", 0), status=record["status"],
        reference=record.get("answer"), samples=samples, chosen=record.get("chosen"),
        answer=record.get("final_answer"), answer_reward=record.get("answer_reward"),
        metrics=record.get("metrics") or {}, error=record.get("error"),
        error_component=record.get("error_component"), attempts=record.get("attempts", 1),
    )


def read_ledger(path: Path) -> Iterator[dict[str, Any]]:
    """Ledger records; a torn last line (the process died mid-write) is ignored."""
    if not path.exists():
        return
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return  # torn tail
            try:
                yield json.loads(raw)
            except json.JSONDecodeError:
                continue


def latest_records(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """episode id -> its last ledger record across ``paths`` (a completed record beats a failed one)."""
    latest: dict[str, dict[str, Any]] = {}
    for path in paths:
        for record in read_ledger(path):
            eid = record["episode_id"]
            old = latest.get(eid)
            if old is None or not (old["status"] == "ok" and record["status"] != "ok"):
                latest[eid] = record
    return latest


class RunOutput:
    """Owns one output directory for one process."""

    def __init__(self, directory: str | Path, *, resume: bool = False, overwrite: bool = False,
                 ledger_name: str = LEDGER, prepared: bool = False):
        """``prepared=True``: a launcher already checked (and, if asked, emptied) the directory for
        this process, one of several workers writing into it; only the own ledger is opened."""
        self.dir = Path(directory)
        self.resume = resume
        self.ledger_path = safe_child(self.dir, ledger_name)
        self._fd: int | None = None
        if prepared:
            self.dir.mkdir(parents=True, exist_ok=True)
        else:
            self.prepare(overwrite)

    def prepare(self, overwrite: bool) -> None:
        existing = run_files(self.dir)
        if existing and not self.resume and not overwrite:
            raise ConfigError(
                f"output.dir: {self.dir} already holds a run ({', '.join(existing)}). Continue it with "
                f"--resume, replace it with --set output.overwrite=true, or choose another directory with -o")
        if self.resume and not ledger_paths(self.dir) and not overwrite:
            raise ConfigError(f"--resume: {self.dir} has no {LEDGER} (or {RANK_LEDGER_GLOB}) to resume from")
        if overwrite and not self.resume:
            for name in existing:
                target = self.dir / name
                shutil.rmtree(target) if target.is_dir() else target.unlink()
        self.dir.mkdir(parents=True, exist_ok=True)

    def completed_ids(self) -> set[str]:
        """Ids of completed episodes in every ledger of the directory (a run may be resumed with a
        different number of workers), when resuming."""
        if not self.resume:
            return set()
        self._repair_ledger()
        paths = ledger_paths(self.dir)
        if self.ledger_path.exists() and self.ledger_path not in [p.resolve() for p in paths]:
            paths.append(self.ledger_path)
        return {eid for eid, rec in latest_records(paths).items() if rec["status"] == "ok"}

    def _repair_ledger(self) -> None:
        """Cut a torn last line so new appends start on a line of their own."""
        if not self.ledger_path.exists():
            return
        data = self.ledger_path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with self.ledger_path.open("r+b") as fh:
                fh.truncate(cut)

    def open(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.ledger_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, result: EpisodeResult) -> None:
        """Persist one finished episode with a single append."""
        if self._fd is None:
            self.open()
        line = json.dumps(record_of(result), ensure_ascii=False, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode("utf-8"))  # type: ignore[arg-type]

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None

    def write_config(self, config: Any) -> None:
        atomic_write_text(self.dir / "config.yaml", config.to_yaml())

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        atomic_write_text(self.dir / "metrics.json", json.dumps(metrics, indent=2, sort_keys=False) + "\n")


def write_derived(directory: Path, records: dict[str, dict[str, Any]], *, save_dataset: bool = True) -> dict[str, int]:
    """Write samples.jsonl, failures.jsonl and the trajectories dataset from ledger records."""
    ordered = sorted(records.values(), key=lambda r: (r.get("index", 0), r["episode_id"]))
    n_samples = n_failed = n_traj = 0
    tmp_samples = directory / ".samples.jsonl.tmp"
    tmp_failures = directory / ".failures.jsonl.tmp"
    with tmp_samples.open("w", encoding="utf-8") as fs, tmp_failures.open("w", encoding="utf-8") as ff:
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
    os.replace(tmp_samples, directory / "samples.jsonl")
    os.replace(tmp_failures, directory / "failures.jsonl")
    if save_dataset:
        save_trajectories(directory, ordered)
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


def save_trajectories(directory: Path, ordered: list[dict[str, Any]]) -> None:
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
    target = directory / "trajectories"
    tmp = directory / ".trajectories.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    quiet = not datasets.are_progress_bars_disabled()
    if quiet:
        datasets.disable_progress_bars()  # the run has its own progress bar; this one is noise
    try:
        dataset.save_to_disk(str(tmp))
    finally:
        if quiet:
            datasets.enable_progress_bars()
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
