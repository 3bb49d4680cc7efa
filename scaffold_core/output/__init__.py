"""A run's output directory: the episode ledger, the files derived from it, and the directory itself.

``files`` (atomic writes, paths that cannot escape), ``ledger`` (one line per
finished episode, read back by ``read_ledger``/``latest_records`` and
``ledger_index``), ``tokens`` (its token arrays, packed in binary in a
sidecar), ``derived`` with ``dataset`` and ``columns`` (samples, failures,
trajectories dataset), ``live`` and ``join`` (those files written as the run
goes, then put in place), ``rundir`` (preparing a directory for a fresh,
resumed or overwritten run) and ``reader`` (reading a finished directory
back: what ``eval`` and ``report`` use).
"""

from .derived import extra_features, save_trajectories, write_derived
from .files import atomic_write_text, safe_child
from .ledger import (
    LEDGER,
    RANK_LEDGER_GLOB,
    latest_records,
    ledger_paths,
    rank_ledger_name,
    read_ledger,
    record_of,
    result_of,
)
from .rundir import RUN_FILES, RunOutput, expand_output_dir, run_files

__all__ = [
    "LEDGER", "RANK_LEDGER_GLOB", "RUN_FILES", "RunOutput", "atomic_write_text", "expand_output_dir",
    "extra_features", "latest_records", "ledger_paths", "rank_ledger_name", "read_ledger", "record_of",
    "result_of", "run_files", "safe_child", "save_trajectories", "write_derived",
]
