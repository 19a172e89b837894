"""Which queues a SQLite database knows (backend.py; main thread of the process that opened
it).

A SQLite "queue" is only a name in the ``jobs`` rows, so a mistyped ``--queue`` was an empty
queue and "0", and a push to it waited for a worker that would never come.  The ``queues``
table names every queue: ``push`` adds its row in its own transaction (a queue exists once a
task was pushed to it, also after every task was cleared or purged), and a worker starting
on a queue stamps ``served_at``/``served_by`` (SqliteBackend's ``serve``).  ``jobq-ctl``
reads it: size/peek/status/failed of a queue the database does not know are "does not exist"
(exit 1), and a push to a queue no worker has ever served warns.  A database made before the
table gets it at the first open by a writer, filled from its jobs (served: a job of the queue
was received).
"""

from __future__ import annotations

import os
import sqlite3

from ..base import BackendError, QueueNotFound

TABLE = """
CREATE TABLE IF NOT EXISTS queues (
    name       TEXT PRIMARY KEY,
    created_at REAL NOT NULL,  -- the first push to it, or the first worker on it
    served_at  REAL,           -- the last start of a worker on it (NULL: never)
    served_by  TEXT
)
"""
# An older database: its queues from its jobs, served when a job was ever received
BACKFILL = (
    "INSERT OR IGNORE INTO queues (name, created_at, served_at) "
    "SELECT queue, MIN(created_at), MAX(CASE WHEN attempt > 0 THEN updated_at END) "
    "FROM jobs GROUP BY queue")


def set_up(conn: sqlite3.Connection) -> None:
    """Create the table, once, filled from the jobs (at open by a writer, after the jobs
    table).  One write transaction: two processes opening an older database at once fill it
    once."""
    if _has_table(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(TABLE)
        conn.execute(BACKFILL)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def record_push(conn: sqlite3.Connection, queue: str, now: float) -> None:
    """Inside push's write transaction: the queue exists from now on."""
    conn.execute("INSERT OR IGNORE INTO queues (name, created_at) VALUES (?, ?)", (queue, now))


def record_served(conn: sqlite3.Connection, queue: str, worker: str, now: float) -> None:
    """A worker starts on ``queue`` (one autocommit statement, at open)."""
    conn.execute("INSERT INTO queues (name, created_at, served_at, served_by) "
                 "VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                 "served_at = excluded.served_at, served_by = excluded.served_by",
                 (queue, now, now, worker))


def require(conn: sqlite3.Connection, queue: str, path: str) -> None:
    """QueueNotFound, one line naming the queue and the known ones, unless ``queue`` is
    known; BackendError when the database cannot be read."""
    try:
        if is_known(conn, queue):
            return
        names = known(conn)
    except sqlite3.DatabaseError as exc:
        raise BackendError(f"SQLite query failed: {exc}") from None
    there = f"its queues: {', '.join(names)}" if names else "it has no queue yet"
    raise QueueNotFound(f"queue {queue!r} does not exist in {os.path.abspath(path)} ({there}; "
                        f"a queue exists once a task was pushed to it or a worker served it)")


def is_known(conn: sqlite3.Connection, queue: str) -> bool:
    """A row of its own, or a job (an older database opened read-only has no table; a job
    written by an older jobq-ctl has no row): two index look-ups."""
    if conn.execute("SELECT 1 FROM jobs WHERE queue=? LIMIT 1", (queue,)).fetchone():
        return True
    return _has_table(conn) and conn.execute(
        "SELECT 1 FROM queues WHERE name=?", (queue,)).fetchone() is not None


def known(conn: sqlite3.Connection) -> list[str]:
    """Every queue the database knows, sorted (for the "does not exist" line only: it reads
    the whole index of jobs)."""
    names = {row[0] for row in conn.execute("SELECT DISTINCT queue FROM jobs")}
    if _has_table(conn):
        names.update(row[0] for row in conn.execute("SELECT name FROM queues"))
    return sorted(names)


def served(conn: sqlite3.Connection) -> list[str]:
    """The queues some worker has started on, sorted; BackendError when the database cannot
    be read."""
    try:
        if not _has_table(conn):
            return []
        return [row[0] for row in conn.execute(
            "SELECT name FROM queues WHERE served_at IS NOT NULL ORDER BY name")]
    except sqlite3.DatabaseError as exc:
        raise BackendError(f"SQLite query failed: {exc}") from None


def _has_table(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='queues'"
                        ).fetchone() is not None
