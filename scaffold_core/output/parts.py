"""The derived files written on several cores: consecutive parts of the records side by side, then joined.

:func:`write_derived_parts` writes the first part in this process and each
other part in a worker process (``python -m scaffold_core.output.parts
PLAN``: a fresh interpreter that imports nothing of the caller's, unlike a
multiprocessing ``spawn``, which re-imports the caller's main module), then
appends the parts in order: ``samples.jsonl``, ``failures.jsonl`` and the
dataset's shards are the same, in content, as one process writes. Every
wait on a worker is bounded; a worker that fails or overruns is killed and
the error raised (the caller then writes everything in one process).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .derived import DerivedWriter
from .files import fresh_dir
from .ledger_index import LedgerChanged, LedgerSlice

#: A worker's time limit: this much, plus PER_RECORD_S per record of its part (hundreds of times the need).
BASE_TIMEOUT_S = 120.0
PER_RECORD_S = 0.05
#: Exit status of a worker that found a ledger line changed since it was indexed.
CHANGED = 3


def write_derived_parts(directory: Path, parts: list[LedgerSlice], *, save_dataset: bool = True,
                        passes: Callable[[], Iterable[Any]] | None = None,
                        private: bool = True) -> dict[str, int]:
    """Write the derived files of ``parts`` (consecutive, in output order) in ``len(parts)`` processes.

    ``passes`` starts a pass over all the records (``(record, blob)`` pairs), in order, for a second pass
    when the dataset's extra columns change after its first chunk. Raises LedgerChanged when a ledger
    line is not a record after all, RuntimeError when a worker fails.
    """
    work = fresh_dir(directory, "trajectories", private=private)  # a temp of the run's files: stale ones are cleaned
    out = DerivedWriter(directory, save_dataset, private=private)
    workers: list[tuple[subprocess.Popen, Path, Path, float]] = []
    try:
        for i, part in enumerate(parts[1:], start=1):
            folder = work / f"part-{i}"
            plan = work / f"part-{i}.json"
            plan.write_text(json.dumps({"paths": part.paths, "files": part.files, "offsets": part.offsets,
                                        "lengths": part.lengths, "folder": str(folder),
                                        "save_dataset": save_dataset, "private": private}), encoding="utf-8")
            log = work / f"part-{i}.log"
            with log.open("wb") as fh:
                proc = subprocess.Popen([sys.executable, "-m", __name__, str(plan)], stdin=subprocess.DEVNULL,
                                        stdout=fh, stderr=subprocess.STDOUT)
            workers.append((proc, folder, log, time.monotonic() + BASE_TIMEOUT_S + PER_RECORD_S * len(part)))
        for rec, blob in parts[0].records():
            out.add(rec, blob)
        results = [_wait(proc, folder, log, deadline) for proc, folder, log, deadline in workers]
        for result in results:
            out.join(result)
        return out.finish(passes)
    finally:
        for proc, *_ in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        out.abort()
        shutil.rmtree(work, ignore_errors=True)


def _wait(proc: subprocess.Popen, folder: Path, log: Path, deadline: float) -> dict[str, Any]:
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
        raise RuntimeError(f"a worker writing derived files did not finish in time (pid {proc.pid})") from None
    tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
    if code == CHANGED:
        raise LedgerChanged(tail.strip().splitlines()[-1] if tail.strip() else "a ledger line changed")
    if code != 0:
        raise RuntimeError(f"a worker writing derived files exited with code {code}: {tail}")
    return json.loads((folder / "result.json").read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    """A worker: write one part (the plan file names its records and folder), leave ``result.json``."""
    plan = json.loads(Path((argv or sys.argv[1:])[0]).read_text(encoding="utf-8"))
    folder = Path(plan["folder"])
    folder.mkdir(parents=True)
    part = LedgerSlice(plan["paths"], plan["files"], plan["offsets"], plan["lengths"])
    out = DerivedWriter(folder, plan["save_dataset"], private=plan["private"], part=folder)
    try:
        for rec, blob in part.records():
            out.add(rec, blob)
    except LedgerChanged as exc:
        print(exc, file=sys.stderr)
        return CHANGED
    result = out.part()
    (folder / "result.json").write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
