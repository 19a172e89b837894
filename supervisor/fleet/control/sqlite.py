"""Control store in the queue's own SQLite file: record_table.py's table, laid out like the
Azure one.

``control_records(part, row, kind, at, rev, doc)``: see record_table.py.  ``rev`` is a change
counter (``control_meta``) taken in the same write transaction; writers are serialised, so
cancels commit in ``rev`` order and a later poll with ``rev > cursor`` misses nothing.  A
cancel's own ttl is read from its document by the purge (``json_extract``).

Threads: one instance per thread (its own connection).  Each write is one short
``BEGIN IMMEDIATE`` transaction; the busy timeout is short (default 1 s) so a queue under
load never holds a control call long, and a busy database raises ControlStoreError.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ...backends.base import BackendConfigError
from ...backends.sqlite import versions
from ...backends.sqlite.db import open_existing, read_only_may_help, use_wal
from .base import ControlConfigError, ControlStoreError
from .record_table import Dialect, RecordTableStore, Row

SCHEMA = """
CREATE TABLE IF NOT EXISTS control_records (
    part TEXT NOT NULL,
    row  TEXT NOT NULL,
    kind TEXT NOT NULL,
    at   REAL NOT NULL,
    rev  INTEGER NOT NULL,
    doc  TEXT NOT NULL,
    PRIMARY KEY (part, row)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS control_by_rev ON control_records (part, rev);
CREATE INDEX IF NOT EXISTS control_by_age ON control_records (kind, at);
CREATE TABLE IF NOT EXISTS control_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO control_meta (name, value) VALUES ('rev', 0);
"""

# A write's rev: the counter its transaction bumped first (one rev per transaction).
_REV = "(SELECT value FROM control_meta WHERE name='rev')"
DIALECT = Dialect(
    table="control_records",
    marker="?",
    rev=_REV,
    bump="UPDATE control_meta SET value=value+1 WHERE name='rev'",
    upsert=(f"INSERT INTO control_records (part, row, kind, at, rev, doc) VALUES "
            f"(?,?,?,?,{_REV},?) ON CONFLICT (part, row) DO UPDATE SET kind=excluded.kind, "
            f"at=excluded.at, rev=excluded.rev, doc=excluded.doc"),
    expires=False,
    # A cancel goes at its own ttl (``at`` is its ``when``); one without a ttl, or whose
    # document is not JSON (readers skip it anyway), at CANCEL_TTL.
    purge=("DELETE FROM control_records WHERE (kind='worker' AND at<?) OR "
           "(kind='cancel' AND (at<? OR at + CASE WHEN json_valid(doc) THEN "
           "json_extract(doc, '$.ttl') END < ?)) OR (kind='cmd' AND at<?) OR "
           "(kind='result' AND at<?) OR (kind=? AND at<?) OR (kind='audit' AND at<?) OR "
           "(kind='unique' AND at<?) OR (kind='history' AND at<?) RETURNING kind"),
    purge_batch=None,  # one short transaction: a week of one queue's records
    for_update="",  # BEGIN IMMEDIATE holds the write lock already
)


def _check_version(conn: sqlite3.Connection, path: str) -> None:
    """ControlConfigError (exit 2) when the file's schema is newer than this build knows
    (backends/sqlite/versions.py): the queue's own check, for the dashboard and the worker's
    control thread, which may open the store without the backend."""
    try:
        versions.check(conn, path)
    except BackendConfigError as exc:
        raise ControlConfigError(str(exc)) from None


class SqliteControlStore(RecordTableStore[sqlite3.Connection]):
    """Control records in ``path`` (normally the queue's database file)."""

    name = "sqlite"

    def __init__(self, path: str, busy_timeout: float = 1.0, create: bool = True) -> None:
        """``create=False`` (read-only jobq-ctl commands): where the file cannot be written
        (a read-only mount, a full disk), it is read as it is, or ControlStoreError."""
        super().__init__(DIALECT)
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ControlConfigError(f"control store: directory {parent} does not exist")
        self.path = path
        try:
            # isolation_level=None: explicit BEGIN IMMEDIATE, so a write never has to upgrade
            # a read lock (SQLite answers that with SQLITE_BUSY at once).
            self._conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None,
                                         check_same_thread=False)
        except sqlite3.Error as exc:
            raise ControlStoreError(f"control store {path}: cannot open: {exc}") from None
        try:
            self._conn.text_factory = lambda b: b.decode("utf-8", "replace")
            use_wal(self._conn, busy_timeout)
            # As the queue's own connections: no fsync per commit (WAL keeps the file
            # consistent; a power cut may lose the last records).  An fsync holds the write
            # lock for milliseconds, and the main loop's settlements wait for that lock.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            _check_version(self._conn, path)  # before it adds a table to a newer schema
            self._conn.executescript(SCHEMA)
        except sqlite3.Error as exc:
            self._conn.close()
            if create or not read_only_may_help(exc):
                raise ControlStoreError(f"control store {path}: {exc}") from None
            self._conn = self._read_only(path, busy_timeout, exc)
        except ControlConfigError:
            self._conn.close()
            raise

    @staticmethod
    def _read_only(path: str, busy_timeout: float, first: sqlite3.Error) -> sqlite3.Connection:
        try:
            conn, found, _target = open_existing(path, busy_timeout, table="control_records")
        except sqlite3.Error:
            raise ControlStoreError(f"control store {path}: {first}") from None
        if not found:  # no worker wrote here yet: nothing to read
            conn.close()
            raise ControlStoreError(f"control store {path}: {first}")
        try:
            _check_version(conn, path)
        except BaseException:
            conn.close()
            raise
        return conn

    def __repr__(self) -> str:
        return f"SqliteControlStore({self.path!r})"

    # ------------------------------------------------------------------------- plumbing
    @contextmanager
    def _tx(self, what: str, write: bool) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise ControlStoreError(f"control store {what}: {exc}") from None

    def _exec(self, conn: sqlite3.Connection, sql: str,
              args: Sequence[object] = ()) -> list[Row]:
        return conn.execute(sql, tuple(args)).fetchall()

    def _exec_many(self, conn: sqlite3.Connection, sql: str,
                   rows: Sequence[Sequence[object]]) -> None:
        conn.executemany(sql, rows)

    def close(self) -> None:
        self._conn.close()
