"""The run store's schema, as an ordered list of migrations.

Each migration is a function decorated with :func:`migration`, named
``mNNN_what_it_does``; :func:`migrate` applies, in order, those a database has
not had yet, each in a transaction of its own together with its entry in the
``_scaffold_migrations`` table (its name and when it was applied). A change to
the schema is a new function at the end of this file, never an edit of one
that has shipped: a store written by any earlier version is brought up to
date when it is opened, and a store written by a later version (one that has
migrations this version does not know) is refused, naming them.
"""

from __future__ import annotations

import datetime
import sqlite3
from collections.abc import Callable

MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = []
TABLE = "_scaffold_migrations"


def migration(fn: Callable[[sqlite3.Connection], None]) -> Callable[[sqlite3.Connection], None]:
    """Add ``fn`` to the end of the list (its name is what a database records)."""
    MIGRATIONS.append(fn)
    return fn


class NewerStore(Exception):
    """The database has migrations this version of scaffold does not know."""


def migrate(db: sqlite3.Connection) -> None:
    """Apply the migrations ``db`` has not had (``db`` in autocommit mode: ``isolation_level=None``)."""
    db.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    known = [fn.__name__ for fn in MIGRATIONS]
    applied = {name for (name,) in db.execute(f"SELECT name FROM {TABLE}")}
    if applied - set(known):
        raise NewerStore(", ".join(sorted(applied - set(known))))
    if applied >= set(known):
        return
    db.execute("BEGIN IMMEDIATE")  # another connection may be migrating the same file: decide inside the lock
    try:
        applied = {name for (name,) in db.execute(f"SELECT name FROM {TABLE}")}
        for fn in MIGRATIONS:
            if fn.__name__ not in applied:
                fn(db)
                db.execute(f"INSERT INTO {TABLE} (name, applied_at) VALUES (?, ?)",
                           (fn.__name__, datetime.datetime.now(datetime.timezone.utc).isoformat()))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


@migration
def m001_episodes(db: sqlite3.Connection) -> None:
    """One row per episode: its latest record (a completed one beats a failed one, see store.UPSERT).

    ``seq`` orders episodes as they were first recorded; ``head`` is the record without its training
    sequences (JSON text); ``rows`` the training sequences' other fields and their token columns'
    segments (JSON text, see :mod:`scaffold_core.output.tokens`), ``tokens`` the segments' arrays.
    """
    db.execute("""
        CREATE TABLE episodes (
            seq INTEGER PRIMARY KEY,
            episode_id TEXT NOT NULL UNIQUE,
            idx INTEGER NOT NULL,
            status TEXT NOT NULL,
            head TEXT NOT NULL,
            rows TEXT,
            tokens BLOB
        )""")
    db.execute("CREATE INDEX episodes_order ON episodes (idx, episode_id)")


@migration
def m002_teacher_kl(db: sqlite3.Connection) -> None:
    """``teacher_kl``: the episode's teacher-student KL when a teacher scored its training sequences (on-policy
    distillation; NULL otherwise): the mean, over the tokens the model generated, of the behaviour logprob
    minus the teacher's. The per-token teacher logprobs themselves are a token column of the sequences
    (``teacher_logprobs``, see :mod:`scaffold_core.output.tokens`)."""
    db.execute("ALTER TABLE episodes ADD COLUMN teacher_kl REAL")
