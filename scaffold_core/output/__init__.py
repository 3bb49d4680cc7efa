"""A run's output directory: the run's store, the files exported from it, and the directory itself.

``files`` (atomic writes, paths that cannot escape), ``store`` (every finished episode in an SQLite
database, its schema in ``migrations``, token arrays encoded by ``tokens``), ``export`` (samples,
failures, the trajectories dataset and Parquet file, written from the store at the end), ``rundir``
(preparing a directory for a fresh, resumed or overwritten run, recording its episodes) and ``reader``
(reading a finished directory back: what ``eval`` and ``report`` use).
"""

from .export import export_run
from .files import atomic_write_text, safe_child
from .rundir import RUN_FILES, RunOutput, expand_output_dir, run_files
from .store import (
    RANK_STORE_GLOB,
    STORE,
    merge_stores,
    rank_store_name,
    read_records,
    record_of,
    result_of,
    store_paths,
)

__all__ = [
    "RANK_STORE_GLOB", "RUN_FILES", "STORE", "RunOutput", "atomic_write_text", "expand_output_dir", "export_run",
    "merge_stores", "rank_store_name", "read_records", "record_of", "result_of", "run_files", "safe_child",
    "store_paths",
]
