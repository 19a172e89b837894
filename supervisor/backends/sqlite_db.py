"""The SQLite queue's schema and how its connections are opened (sqlite.py, sqlite_lease.py).

Kept apart from the backend so that sqlite.py stays about receiving and settling jobs.
"""

from __future__ import annotations

import sqlite3

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
    UNIQUE (queue, id)
);
-- Receive walks pending jobs in seq order and stops after LIMIT: ordered by (visible_at, seq)
-- (the first schema) it had to sort every pending job on each receive, O(queue depth).
DROP INDEX IF EXISTS jobs_by_state;
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs (queue, status, seq, visible_at);
"""


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
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def is_readonly_error(exc: sqlite3.Error) -> bool:
    # SQLITE_READONLY (8) and its extended codes: a read-only file, directory or mount
    code = getattr(exc, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF == 8) or "readonly" in str(exc).lower()


def is_lock_error(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text
