"""The SQLite database's schema version, in ``PRAGMA user_version`` (db.py's ``set_up``, the
read-only opens of backend.py, the control store of fleet/control/sqlite.py; main thread, or
the thread opening a control store).

A writer brings an older database up to ``VERSION`` (db.py: the missing columns and tables,
each step idempotent) and then stamps it; a read-only command stamps nothing.  Every opener
refuses a database stamped with a version newer than it knows: a build older than the
database's schema would run without what the schema added (an older worker fills no
``owner``, so what it held comes back only through the 90-minute stale-lock reaper) or break
what a newer build relies on.  The refusal is a BackendConfigError, one line, exit 2
(docs/production.rst, "Downgrades").

Databases made before versions were recorded read 0; they are migrated and stamped like any
older one.  Versions (each a change a build without it cannot use safely):

1. the ``jobs`` table (the first release);
2. ``priority`` and ``unique_key`` (``push --priority``, ``--unique``) and their indexes;
3. ``owner`` (the dead-owner pass: backends/sqlite/owner.py);
4. the ``queues`` table (backends/sqlite/queues.py).

A change to the schema -- the jobs or queues table, or the control store's tables in the same
file -- appends a version here, and a step to db.py's ``set_up`` that a database at any
earlier version (0 included) passes through.
"""

from __future__ import annotations

import sqlite3

from ...core.build import version as build_version
from ..base import BackendConfigError

VERSION = 4  # the newest schema this build knows (see the list above)
DOWNGRADES = 'see docs/production.rst "Downgrades"'


def read(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def check(conn: sqlite3.Connection, path: str) -> int:
    """The database's version; BackendConfigError when it is newer than ``VERSION``."""
    found = read(conn)
    if found > VERSION:
        raise BackendConfigError(newer_text(path, found))
    return found


def newer_text(path: str, found: int) -> str:
    return (f"--sqlite-path: {path} has schema version {found}; this build "
            f"({build_version()}) knows up to {VERSION}: upgrade jobq-supervisor here, "
            f"or {DOWNGRADES}")


def stamp(conn: sqlite3.Connection, path: str) -> None:
    """Record ``VERSION`` once the schema is at it (at open by a writer, after every step).
    One write transaction that reads the version again: it never lowers a version a newer
    build stamped in the meantime (that is refused instead), and writes nothing when the
    version is current."""
    if read(conn) == VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if check(conn, path) < VERSION:
            conn.execute(f"PRAGMA user_version={VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
