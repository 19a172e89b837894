"""The GRANTs of docs/backends.rst ("Roles"), applied as written: the admin role migrates,
the worker role reads and writes rows (and finds the schema current, creating nothing) and
uses the control store, the operators' role only reads, the control store too."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from supervisor.backends.postgres import schema as sc
from supervisor.fleet.control import Cancel, ControlStoreError, ResultRecord, WorkerRecord
from supervisor.fleet.control.base import UniqueClaim
from supervisor.fleet.control.postgres import PostgresControlStore
from supervisor.fleet.output.base import AttemptKey, Chunk, OutputConfigError
from supervisor.fleet.output.postgres import PostgresOutputStore
from tests.postgres.server import PASSWORD
from tests.postgres.test_schema import ctl

pytestmark = pytest.mark.timeout(90)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "backends.rst"
ROLES = ("jobq_admin", "jobq_worker", "jobq_reader")
LATEST = len(sc.MIGRATIONS)
NOW = 1_700_000_000.0


def documented_grants() -> tuple[str, str]:
    """The Roles section's SQL: (the first block: the admin role, the rest)."""
    text = DOCS.read_text().split("**Roles.**", 1)[1].split(".. code-block:: sql", 1)[1]
    lines = []
    for line in text.splitlines()[1:]:
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    sql = "\n".join(lines).strip()
    first, rest = re.split(r"\n\s*\n", sql, maxsplit=1)
    return first, rest


@pytest.fixture
def roles(pg_server, pg_url):
    """Unique role names for this test (roles belong to the whole server)."""
    suffix = uuid.uuid4().hex[:8]
    names = {r: f"{r}_{suffix}" for r in ROLES}
    yield names
    pg_server.ensure_running()
    pg_server.drop_database(pg_url.rsplit("/", 1)[1])  # what the roles own goes with it
    for name in names.values():
        pg_server.admin(f"DROP ROLE IF EXISTS {name}")


def role_url(pg_url: str, roles: dict[str, str], role: str, password: str) -> str:
    """``pg_url`` as the test's ``role`` (with the docs' password)."""
    return pg_url.replace(f"postgres:{PASSWORD}@", f"{roles[role]}:{password}@")


def apply_documented_grants(pg_server, pg_url: str, roles: dict[str, str]) -> None:
    """The Roles section as an administrator runs it on the test's database: the roles made,
    the schema migrated by the admin role, then the GRANTs."""
    db = pg_url.rsplit("/", 1)[1]

    def local(sql: str) -> str:
        sql = sql.replace("DATABASE jobs", f"DATABASE {db}")
        for role, name in roles.items():
            sql = sql.replace(role, name)
        return sql

    first, rest = documented_grants()
    pg_server.admin(local(first), dbname=db)
    res = ctl(role_url(pg_url, roles, "jobq_admin", "admin-secret"), "migrate")
    assert (res.returncode, res.stdout) == (
        0, f"schema jobq: created at version {LATEST}\n"), res.stderr
    with psycopg.connect(pg_url, autocommit=True) as su:
        su.execute(local(rest))


def test_documented_grants(pg_server, pg_url, roles) -> None:
    def url(role: str, password: str) -> str:
        return role_url(pg_url, roles, role, password)

    apply_documented_grants(pg_server, pg_url, roles)
    worker = url("jobq_worker", "worker-secret")
    with psycopg.connect(worker, autocommit=True) as conn:
        assert sc.check_schema(conn, "jobq", create=True) == LATEST
        conn.execute("INSERT INTO jobq.queues (name, first_served) VALUES ('q', now())")
        conn.execute("INSERT INTO jobq.jobs (id, queue, body) VALUES ('t1', 'q', '{}')")
        assert conn.execute("UPDATE jobq.jobs SET state = 'running', attempt = attempt + 1 "
                            "WHERE id = 't1'").rowcount == 1
        conn.execute("SELECT pg_advisory_xact_lock(1)")
        conn.execute("SELECT pg_notify('jobq.wake', 'q')")
        assert conn.execute("DELETE FROM jobq.jobs WHERE id = 't1'").rowcount == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE jobq.other (x int)")
    assert ctl(worker, "migrate").stdout == f"schema jobq: at version {LATEST} already\n"
    _control_store_as_worker(worker)
    # the output store as a worker and as a reader use it (fleet/output/postgres.py)
    key = AttemptKey("q", "t1", 1)
    writer = PostgresOutputStore(worker, "jobq")
    try:
        assert writer.reopen(key) == 0
        writer.append(key, b"out\n")
        writer.finish(key)
        assert writer.purge(time.time() - 3600) == 0
    finally:
        writer.close()
    out_reader = PostgresOutputStore(url("jobq_reader", "reader-secret"), "jobq", create=False)
    try:
        assert out_reader.read(key) == Chunk(b"out\n", 4, True)
        assert out_reader.attempts("q", "t1") == [1]
        with pytest.raises(OutputConfigError, match="permission denied"):
            out_reader.append(AttemptKey("q", "t2", 1), b"x")
    finally:
        out_reader.close()
    reader = url("jobq_reader", "reader-secret")
    with psycopg.connect(reader, autocommit=True) as conn:
        assert sc.check_schema(conn, "jobq", create=False) == LATEST
        assert conn.execute("SELECT count(*) FROM jobq.jobs").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO jobq.jobs (id, queue, body) VALUES ('t2', 'q', '{}')")
    _control_store_as_reader(reader)
    assert ctl(reader, "workers").returncode == 0
    refused = ctl(reader, "cancel", "0" * 32)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "permission denied" in refused.stderr and "reader-secret" not in refused.stderr


def _control_store_as_worker(url: str) -> None:
    """Everything a worker and a writing jobq-ctl do on the control store."""
    store = PostgresControlStore(url, "jobq")
    try:
        store.put_worker(WorkerRecord(id="w1", queue="q", host="h", pid=1, version="0",
                                      state="running", slots_used=0, slots_total=1,
                                      started=NOW, heartbeat=NOW))
        store.put_cancel(Cancel(queue="q", task_id="t1", reason="r", who="ops", when=NOW))
        assert [c.task_id for c in store.poll("q", "w1").cancels] == ["t1"]
        store.put_results([ResultRecord(queue="q", task_id="t1", attempt=1, outcome="failed",
                                        reason="", tail="", exit_status=1, worker="w1",
                                        when=NOW)])
        assert store.create_claim(UniqueClaim("q", "k", "t1", NOW))
        store.release_claim("q", "k", "t1")
        assert store.purge(NOW + 400 * 86_400).workers == 1
    finally:
        store.close()


def _control_store_as_reader(url: str) -> None:
    """The read-only role reads the control store (status, workers, result) and may write
    nothing: a write is one ControlStoreError line."""
    store = PostgresControlStore(url, "jobq", create=False)
    try:
        assert store.workers("q") == [] and store.results("q") == []
        assert store.poll("q", "w1").cancels == ()
        with pytest.raises(ControlStoreError) as info:
            store.put_cancel(Cancel(queue="q", task_id="t2", reason="r", who="ops", when=NOW))
        assert "permission denied" in str(info.value) and "\n" not in str(info.value)
        assert "reader-secret" not in str(info.value)
    finally:
        store.close()
