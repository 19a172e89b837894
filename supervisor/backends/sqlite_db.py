"""The SQLite queue's schema and how its connections are opened (sqlite.py, sqlite_lease.py).

Kept apart from the backend so that sqlite.py stays about receiving and settling jobs.
"""

from __future__ import annotations

import sqlite3
import time

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT    NOT NULL,
    queue        TEXT    NOT NULL,
    body         TEXT    NOT NULL,
    status       TEXT    NOT NULL
                 CHECK (status IN ('pending', 'running', 'succeeded', 'failed')),
    attempt      INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER,
    preemptions  INTEGER NOT NULL DEFAULT 0,
    token        INTEGER NOT NULL DEFAULT 0,
    locked_by    TEXT,
    locked_at    REAL,
    locked_until REAL,
    visible_at   REAL    NOT NULL DEFAULT 0,
    created_at   REAL    NOT NULL,
    updated_at   REAL    NOT NULL,
    reason       TEXT,
    output_tail  TEXT,
    exit_status  INTEGER,
    priority     INTEGER NOT NULL DEFAULT 5,
    unique_key   TEXT,
    UNIQUE (queue, id)
);
"""
# Added after the first release: a database made before them gets them (migrate), with
# their defaults, so older jobs read as priority 5 without a key.
COLUMNS = (("priority", "INTEGER NOT NULL DEFAULT 5"), ("unique_key", "TEXT"))
INDEXES = """
-- Receive walks pending jobs in (priority DESC, seq) order and stops after LIMIT, so its
-- cost does not grow with the queue's depth (ordered by (visible_at, seq), the first schema
-- sorted every pending job on each receive).  It replaces jobs_ready (queue, status, seq,
-- visible_at): a second index over every job cost each receive and settle ~30 % more.
DROP INDEX IF EXISTS jobs_by_state;
DROP INDEX IF EXISTS jobs_ready;
CREATE INDEX IF NOT EXISTS jobs_by_priority
    ON jobs (queue, status, priority DESC, seq, visible_at);
-- At most one live task per key: push looks it up here inside its write transaction, and
-- any other write that would make a second one (a requeue) fails instead.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_unique ON jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'running');
-- Succeeded jobs by age, for the purge past --retention (sqlite_retention.py): a pass with
-- nothing due is one probe instead of a scan of every succeeded job.  Partial: a receive never
-- touches it, and a completion adds one entry (measured: +4 % on a bare receive + complete).
CREATE INDEX IF NOT EXISTS jobs_done ON jobs (queue, updated_at) WHERE status = 'succeeded';
"""


def set_up(conn: sqlite3.Connection) -> None:
    """Create the table, add the columns an older database lacks, create the indexes (at
    open, main thread).  The check and the ALTERs are one write transaction: two workers
    opening an old database at once add each column once."""
    conn.executescript(SCHEMA)
    if missing_columns(conn):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for name, decl in missing_columns(conn):
                conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {decl}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    conn.executescript(INDEXES)


def missing_columns(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    have = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    return [(name, decl) for name, decl in COLUMNS if name not in have]


def connect(path: str, busy_timeout: float, setup: bool = True) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a write never has to
    # upgrade a read lock (which SQLite answers with SQLITE_BUSY without waiting).
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None,
                           check_same_thread=False)
    # Text that is not UTF-8 (another tool wrote the table, or a BLOB cast to TEXT) must not
    # make a whole SELECT fail: one such body would stall every receive.  It reads with
    # U+FFFD instead and the body is dead-lettered as poison (as on Storage Queue).
    conn.text_factory = _decode_text
    if setup:  # WAL is a property of the file: switching to it is a write
        use_wal(conn, busy_timeout)
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def use_wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Switch the file to WAL, retrying while it is locked, up to ``busy_timeout`` (the
    thread opening a queue or control store connection, at open).

    SQLite answers the switch with SQLITE_BUSY at once, without its busy handler, while
    another connection holds a write lock on a file still in rollback mode (it would have
    to wait holding a read lock: a deadlock).  Several processes opening a database made by
    an older tool (or sqlite3's default) at once hit that: each must wait its turn."""
    deadline = time.monotonic() + busy_timeout
    pause = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            left = deadline - time.monotonic()
            if not is_lock_error(exc) or left <= 0:
                raise
        time.sleep(min(pause, left))  # at open, bounded by busy_timeout
        pause = min(pause * 2, 0.1)


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def is_readonly_error(exc: sqlite3.Error) -> bool:
    # SQLITE_READONLY (8) and its extended codes: a read-only file, directory or mount
    code = getattr(exc, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF == 8) or "readonly" in str(exc).lower()


def is_lock_error(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text
