"""Issue 40 §2, schema versions: a SQLite database records its schema's version
(``PRAGMA user_version``, backends/sqlite/versions.py) when it is created or migrated, and a
worker or any jobq-ctl command refuses a database (SQLite) or schema (PostgreSQL, ``meta``)
newer than its build knows: exit 2, one line naming the build and docs/production.rst
"Downgrades", nothing changed.  Real jobq-supervisor and jobq-ctl processes, real files, the
real PostgreSQL server."""

from __future__ import annotations

import sqlite3
import time

import psycopg
import pytest

from supervisor.backends.postgres.schema import LATEST
from supervisor.backends.sqlite import versions
from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.build import version
from supervisor.core.task import Task
from supervisor.fleet.control.base import ControlConfigError
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests.integration.helpers import one_error_line
from tests.integration.test_scheduling_sqlite import OLD_SCHEMA

pytestmark = pytest.mark.timeout(120)

# every kind of command: a worker, a writer, the read-only ones, a fleet command
CTL_COMMANDS = (("push", "-c", "true"), ("status",), ("size",), ("peek",), ("workers",),
                ("cancel", "x"))


def user_version(path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


def set_user_version(path, value: int) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA user_version={value}")
    finally:
        conn.close()


def stamp_newer(fenv) -> tuple[int, int]:
    """Stamp the queue's schema one version past this build's: (found, known)."""
    url = getattr(fenv, "url", None)
    if url is None:
        set_user_version(fenv.db, versions.VERSION + 1)
        return versions.VERSION + 1, versions.VERSION
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE jobq.meta SET value = %s WHERE key = 'version'", (str(LATEST + 1),))
    return LATEST + 1, LATEST


def refusal(fenv, found: int, known: int) -> str:
    where = ("PostgreSQL: schema jobq has version" if getattr(fenv, "url", None)
             else f"--sqlite-path: {fenv.db} has schema version")
    return (f"{where} {found}; this build ({version()}) knows up to {known}: "
            f"upgrade jobq-supervisor here, or see docs/production.rst \"Downgrades\"")


def jobs(fenv) -> int:
    return len(fenv.rows("SELECT id FROM jobq.jobs" if getattr(fenv, "url", None)
                         else "SELECT id FROM jobs"))


def test_a_newer_schema_is_refused_by_the_worker_and_every_command(fenv) -> None:
    fenv.push("true")
    fenv.serve()
    found, known = stamp_newer(fenv)
    line = refusal(fenv, found, known)
    sup = fenv.supervisor("-n", "1", "--exit-when-empty", "--poll-interval", "0.2",
                          "--control-interval", "1")
    assert sup.wait(60) == 2, sup.log()
    lines = sup.log().splitlines()
    assert len(lines) == 1 and lines[0].endswith(line), sup.log()
    for args in CTL_COMMANDS:
        res = fenv.ctl(*args, check=False)
        # the fleet commands on PostgreSQL open the control store only: "control store: ..."
        assert one_error_line(res, 2).endswith(line) and res.stdout == "", (args, res)
    assert jobs(fenv) == 1  # nothing pushed, nothing run
    assert "Traceback" not in sup.log()
    if not getattr(fenv, "url", None):
        assert user_version(fenv.db) == found  # nothing lowered it


def test_a_fresh_database_is_stamped(env) -> None:
    env.push("true")
    assert user_version(env.db) == versions.VERSION


def test_an_older_database_is_migrated_and_stamped_by_a_writer_only(env) -> None:
    conn = sqlite3.connect(env.db)
    conn.executescript(OLD_SCHEMA)
    now = time.time()
    conn.execute("INSERT INTO jobs (id, queue, body, status, created_at, updated_at) VALUES "
                 "('old', 'default', ?, 'pending', ?, ?)", (Task(cmd="true").to_json(), now, now))
    conn.commit()
    conn.close()
    assert user_version(env.db) == 0
    assert env.ctl("status").returncode == 0 and env.ctl("size").stdout.strip() == "1"
    assert user_version(env.db) == 0  # read-only: nothing written
    env.push("true")
    assert user_version(env.db) == versions.VERSION
    assert {"priority", "unique_key", "owner"} <= {
        r[1] for r in env.rows("PRAGMA table_info(jobs)")}
    # a database of the previous build (every column, no version) is stamped by a worker
    set_user_version(env.db, 0)
    sup = env.supervisor("-n", "1", "--exit-when-empty", "--poll-interval", "0.2")
    assert sup.wait(60) == 0, sup.log()
    assert user_version(env.db) == versions.VERSION
    assert env.rows("SELECT status FROM jobs") == [("succeeded",)] * 2


def test_an_intermediate_version_is_brought_up(env) -> None:
    env.push("true")
    set_user_version(env.db, versions.VERSION - 1)
    SqliteBackend(str(env.db), "default", "w").close()
    assert user_version(env.db) == versions.VERSION


@pytest.mark.parametrize("create", [True, False])
def test_the_control_store_alone_refuses_a_newer_file(env, create) -> None:
    """The dashboard and a worker's control thread open it without the backend."""
    env.push("true")
    SqliteControlStore(str(env.db)).close()  # its tables, as a worker's first heartbeat
    set_user_version(env.db, versions.VERSION + 1)
    with pytest.raises(ControlConfigError) as info:
        SqliteControlStore(str(env.db), create=create)
    assert str(info.value) == refusal(env, versions.VERSION + 1, versions.VERSION)
    assert "control_records" in {
        r[0] for r in env.rows("SELECT name FROM sqlite_master WHERE type='table'")}
