"""The SQLite queue's schema and how its connections are opened (backend.py,
backends/sqlite/lease.py).

Kept apart from the backend so that backend.py stays about receiving and settling jobs.
"""

from __future__ import annotations

import os
import sqlite3
import time
from urllib.parse import quote

from . import queues as sqlite_queues
from . import versions

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
    owner        TEXT,
    UNIQUE (queue, id)
);
"""
# Added after the first release: a database made before them gets them (migrate), with
# their defaults, so older jobs read as priority 5 without a key, and a job an older
# worker runs names no owner (only the stale-lock reaper takes it back: backends/sqlite/owner.py).
COLUMNS = (("priority", "INTEGER NOT NULL DEFAULT 5"), ("unique_key", "TEXT"),
           ("owner", "TEXT"))
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
-- Succeeded jobs by age, for the purge past --retention (backends/sqlite/retention.py): a pass with
-- nothing due is one probe instead of a scan of every succeeded job.  Partial: a receive never
-- touches it, and a completion adds one entry (measured: +4 % on a bare receive + complete).
CREATE INDEX IF NOT EXISTS jobs_done ON jobs (queue, updated_at) WHERE status = 'succeeded';
"""


def set_up(conn: sqlite3.Connection, path: str) -> None:
    """Refuse a newer schema, create the table, add the columns an older database lacks,
    create the indexes, stamp the version (at open, main thread; backends/sqlite/versions.py).
    The check and the ALTERs are one write transaction: two workers opening an old database
    at once add each column once."""
    versions.check(conn, path)  # before any change: a newer build's schema is left as it is
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
    sqlite_queues.set_up(conn)  # the queues table (backends/sqlite/queues.py)
    versions.stamp(conn, path)


def missing_columns(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    have = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    return [(name, decl) for name, decl in COLUMNS if name not in have]


def connect(path: str, busy_timeout: float, setup: bool = True,
            uri: bool = False) -> sqlite3.Connection:
    """``uri``: ``path`` is a ``file:`` URI (``open_existing``'s read-only ways)."""
    # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a write never has to
    # upgrade a read lock (which SQLite answers with SQLITE_BUSY without waiting).
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None,
                           check_same_thread=False, uri=uri)
    # Text that is not UTF-8 (another tool wrote the table, or a BLOB cast to TEXT) must not
    # make a whole SELECT fail: one such body would stall every receive.  It reads with
    # U+FFFD instead and the body is dead-lettered as poison (as on Storage Queue).
    conn.text_factory = _decode_text
    try:
        if setup:  # WAL is a property of the file: switching to it is a write
            use_wal(conn, busy_timeout)
        conn.execute("PRAGMA synchronous=NORMAL")  # reads the file (a full disk fails here)
    except BaseException:
        conn.close()
        raise
    return conn


HAS_TABLE = "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?"


def open_existing(path: str, busy_timeout: float,
                  table: str = "jobs") -> tuple[sqlite3.Connection, bool, str]:
    """Open an existing database to read it, without writing anything (read-only jobq-ctl
    commands, main thread): the connection, whether it holds ``table``, and the target
    (``path`` or a ``file:`` URI) to open further connections the same way.

    Reading a WAL database normally writes too: its ``-shm`` file is created (or grown),
    which fails on a read-only mount or directory (SQLITE_CANTOPEN) and on a full disk
    (SQLITE_IOERR, SQLITE_FULL).  Then it is opened ``mode=ro``, which reads the WAL
    through an existing ``-shm``; with no ``-shm`` to read (the last writer closed cleanly
    and removed it and the ``-wal``), ``immutable=1``, which reads the database file alone
    -- only when no ``-wal`` holds frames, else it would show an old state."""
    try:
        return _probe(path, busy_timeout, table, uri=False)
    except sqlite3.OperationalError as exc:
        if not read_only_may_help(exc):
            raise
        first = exc
    base = "file:" + quote(os.path.abspath(path))
    for mode in ("mode=ro", "immutable=1"):
        if mode == "immutable=1" and _wal_has_frames(path):
            break
        try:
            return _probe(f"{base}?{mode}", busy_timeout, table, uri=True)
        except sqlite3.OperationalError:
            continue
    raise first


def read_only_may_help(exc: sqlite3.Error) -> bool:
    """An open failed as it does where the ``-shm`` cannot be made: a read-only mount or
    directory, a full disk (``open_existing`` then opens the file read-only)."""
    return is_readonly_error(exc) or _code(exc) == SQLITE_CANTOPEN or is_transient_error(exc)


def _probe(target: str, busy_timeout: float, table: str,
           uri: bool) -> tuple[sqlite3.Connection, bool, str]:
    conn = connect(target, busy_timeout, setup=False, uri=uri)  # its PRAGMA reads already
    try:
        return conn, conn.execute(HAS_TABLE, (table,)).fetchone() is not None, target
    except BaseException:
        conn.close()
        raise


def _wal_has_frames(path: str) -> bool:
    try:
        return os.path.getsize(path + "-wal") > 0
    except OSError:
        return False


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


# Primary result codes (the low byte of sqlite_errorcode)
SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN = 8, 10, 13, 14
FULL_BELOW = 64 << 10  # free bytes under which a filesystem counts as full


def _code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_transient_error(exc: sqlite3.Error) -> bool:
    """A full disk (SQLITE_FULL) or an I/O error (SQLITE_IOERR -- also what a ``-shm`` file
    that cannot grow on a full disk gives): freeing space or a retry may cure it, unlike a
    file that is not a database or may not be written (a configuration error, exit 2)."""
    code = _code(exc)
    if code is not None:
        return code in (SQLITE_IOERR, SQLITE_FULL)
    text = str(exc).lower()
    return "disk is full" in text or "disk i/o error" in text


def transient_text(path: str, exc: sqlite3.Error) -> str:
    """The one line for a transient fault on ``path``: says so when its disk is full."""
    if _code(exc) == SQLITE_FULL or disk_full(path):
        return (f"SQLite database {path}: the disk is full ({exc}); free space, "
                f"then retry")
    return f"SQLite database {path}: I/O error ({exc}); retry, and check the disk if it lasts"


def disk_full(path: str) -> bool:
    """Whether the filesystem holding ``path`` has (almost) no space or no inodes left."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BELOW or (st.f_files > 0 and st.f_favail == 0)


def is_readonly_error(exc: sqlite3.Error) -> bool:
    # SQLITE_READONLY (8) and its extended codes: a read-only file, directory or mount
    return _code(exc) == SQLITE_READONLY or "readonly" in str(exc).lower()


def unwritable(path: str) -> bool:
    """The file or its directory may not be written (a read-only mount or permissions):
    what SQLite reports as "unable to open database file" when it cannot make the -shm."""
    return not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK) or (
        os.path.exists(path) and not os.access(path, os.W_OK))


def is_lock_error(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text
