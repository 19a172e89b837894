"""backends/postgres/schema.py and ``jobq-ctl migrate`` against a real server: migration 1
is the schema contract, migrate is idempotent and safe when several hosts run it at once,
``--print`` creates the same schema through psql, read-only commands create nothing, a
role without the privilege or a newer schema is exit 2 with one line, and a heartbeat's
UPDATE of locked_until is a HOT update (no index touches it)."""

from __future__ import annotations

import os
import subprocess
import uuid

import psycopg
import pytest

from supervisor.backends.base import BackendConfigError, QueueNotFound
from supervisor.backends.postgres import schema as sc
from supervisor.core.build import version
from tests import ctl_server
from tests.conftest import command, wait_for
from tests.postgres.server import PASSWORD, free_port

pytestmark = pytest.mark.timeout(90)
LATEST = len(sc.MIGRATIONS)  # never a number: other migrations are appended


def ctl(url: str, *args: str, schema: str = "jobq") -> subprocess.CompletedProcess:
    """``jobq-ctl --backend postgres ... migrate`` with the URL in the environment, as the
    docs recommend (no PG* or JOBQ_* variable of the machine leaks in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "JOBQ_"))}
    env["JOBQ_POSTGRES_URL"] = url
    return ctl_server.run([*command("jobq-ctl"), "--backend", "postgres", "--postgres-schema",
                           schema, *args], timeout=60, env=env)


def popen_ctl(url: str, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "JOBQ_"))}
    env["JOBQ_POSTGRES_URL"] = url
    return subprocess.Popen([*command("jobq-ctl"), "--backend", "postgres", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def fingerprint(url: str, schema: str = "jobq") -> dict[str, list]:
    """What the schema is made of, from the catalogs."""
    with psycopg.connect(url, autocommit=True) as conn:
        def q(sql: str) -> list:
            return conn.execute(sql, (schema,) if "%s" in sql else None).fetchall()

        return {
            "columns": q("SELECT table_name, column_name, data_type, column_default, "
                         "is_nullable FROM information_schema.columns WHERE table_schema = %s "
                         "ORDER BY 1, 2"),
            "indexes": q("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s "
                         "ORDER BY 1"),
            "reloptions": q("SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace "
                            "n ON n.oid = c.relnamespace WHERE n.nspname = %s AND "
                            "c.relkind = 'r' ORDER BY 1"),
            "constraints": q("SELECT conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
                             "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = "
                             "%s ORDER BY 1"),
            "meta": q("SELECT key, value FROM jobq.meta ORDER BY 1") if schema == "jobq" else [],
        }


def schema_exists(url: str, schema: str = "jobq") -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return bool(conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                                 (schema,)).fetchone())


@pytest.fixture
def role(pg_server, pg_url):
    """A login role with no privilege beyond PUBLIC's (no CREATE on the database): its URL."""
    name = "r_" + uuid.uuid4().hex[:12]
    pg_server.admin(f"CREATE ROLE {name} LOGIN PASSWORD 'r0le-Passw0rd'")
    yield pg_url.replace(f"postgres:{PASSWORD}@", f"{name}:r0le-Passw0rd@")
    pg_server.ensure_running()
    pg_server.drop_database(pg_url.rsplit("/", 1)[1])  # before the role: nothing refers to it
    pg_server.admin(f"DROP ROLE IF EXISTS {name}")


def test_migration_1_is_the_contract(pg_url) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert sc.migrate(conn, "jobq") == (0, LATEST)
        assert sc.migrate(conn, "jobq") == (LATEST, LATEST)  # idempotent
        assert sc.read_version(conn, "jobq") == LATEST
    fp = fingerprint(pg_url)
    cols = {(t, c) for t, c, *_ in fp["columns"]}
    assert {("meta", "key"), ("meta", "value"), ("queues", "name"),
            ("queues", "first_served")} <= cols
    assert {c for t, c in cols if t == "jobs"} == {
        "id", "queue", "state", "priority", "run_at", "body", "unique_key", "attempt", "owner",
        "locked_until", "created_at", "started_at", "ended_at", "reason", "output_tail",
        "exit_status", "worker"}
    indexes = dict(fp["indexes"])
    assert "WHERE (state = 'pending'::text)" in indexes["jobs_pending"]
    assert "(queue, priority DESC, run_at, id)" in indexes["jobs_pending"]
    assert "WHERE (state = 'running'::text)" in indexes["jobs_running"]
    assert indexes["jobs_unique_key"].startswith("CREATE UNIQUE INDEX")
    assert "(queue, unique_key)" in indexes["jobs_unique_key"]
    assert "(ended_at)" in indexes["jobs_ended"]
    assert not [d for d in indexes.values() if "locked_until" in d]
    options = dict(fp["reloptions"])["jobs"]
    assert {"fillfactor=70", "autovacuum_vacuum_scale_factor=0.01",
            "autovacuum_analyze_scale_factor=0.02",
            "autovacuum_vacuum_cost_delay=0"} <= set(options)
    assert fp["meta"] == [("version", str(LATEST))]


def test_print_applied_by_psql_makes_the_same_schema(pg_server, pg_url) -> None:
    other = pg_server.url(pg_server.create_database())
    try:
        assert ctl(pg_url, "migrate").returncode == 0
        printed = ctl("", "migrate", "--print")  # connects to nothing
        assert printed.returncode == 0 and printed.stderr == ""
        for _ in range(2):  # applying it again changes nothing
            res = pg_server.psql(printed.stdout, other)
            assert res.returncode == 0, res.stderr
        assert fingerprint(other) == fingerprint(pg_url)
        again = ctl(other, "migrate")
        assert (again.returncode, again.stdout) == (
            0, f"schema jobq: at version {LATEST} already\n")
    finally:
        pg_server.drop_database(other.rsplit("/", 1)[1])


def test_concurrent_migrates_both_succeed_with_one_schema(pg_server, pg_url) -> None:
    """Four ``jobq-ctl migrate`` at once: the test holds the advisory lock until all four
    wait on it, so they really contend; each exits 0, one created the schema."""
    with psycopg.connect(pg_url, autocommit=True) as holder:
        with holder.transaction():
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (sc.lock_key("jobq"),))
            procs = [popen_ctl(pg_url, "migrate") for _ in range(4)]
            wait_for(lambda: holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()[0] == 4, 60, what="four migrates waiting on the advisory lock")
        outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    lines = sorted(out for out, _err in outs)
    assert lines == [f"schema jobq: at version {LATEST} already\n"] * 3 + [
        f"schema jobq: created at version {LATEST}\n"]
    assert fingerprint(pg_url)["meta"] == [("version", str(LATEST))]


def test_read_only_check_creates_nothing(pg_url) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        with pytest.raises(QueueNotFound) as info:
            sc.check_schema(conn, "jobq", create=False)
        assert "schema jobq does not exist" in str(info.value)
        assert "`jobq-ctl migrate`" in str(info.value)
        assert not schema_exists(pg_url)
        assert sc.check_schema(conn, "jobq", create=True) == LATEST  # a worker, push: created
        assert sc.check_schema(conn, "jobq", create=False) == LATEST


def test_role_without_create_is_exit_2_naming_migrate(pg_url, role) -> None:
    with psycopg.connect(role, autocommit=True) as conn:
        with pytest.raises(BackendConfigError) as info:
            sc.check_schema(conn, "jobq", create=True, url=role)
    text = str(info.value)
    assert "may not create or upgrade schema jobq" in text and "\n" not in text
    assert "run `jobq-ctl migrate` (or have a DBA apply `jobq-ctl migrate --print`)" in text
    assert "r0le-Passw0rd" not in text
    res = ctl(role, "migrate")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("jobq-ctl: error: PostgreSQL: this role may not create")
    assert res.stderr.count("\n") == 1 and "`jobq-ctl migrate --print`" in res.stderr
    assert not schema_exists(pg_url)


def test_newer_schema_is_exit_2(pg_url) -> None:
    assert ctl(pg_url, "migrate").returncode == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE jobq.meta SET value = '99' WHERE key = 'version'")
        for create in (True, False):
            with pytest.raises(BackendConfigError) as info:
                sc.check_schema(conn, "jobq", create=create)
            assert not isinstance(info.value, QueueNotFound)
            assert f"has version 99; this build ({version()}) knows up to {LATEST}" in str(
                info.value)
    res = ctl(pg_url, "migrate")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "version 99" in res.stderr


def test_other_schema_name(pg_url) -> None:
    res = ctl(pg_url, "migrate", schema="team_a")
    assert (res.returncode, res.stdout) == (0, f"schema team_a: created at version {LATEST}\n")
    assert schema_exists(pg_url, "team_a") and not schema_exists(pg_url, "jobq")


@pytest.mark.parametrize("case", ["wrong password", "missing database", "unreachable",
                                  "TLS refused"])
def test_migrate_cannot_connect_is_one_line_exit_1(pg_server, pg_url, case) -> None:
    db = pg_url.rsplit("/", 1)[1]
    url = {"wrong password": pg_server.url(db, password="Wr0ngPassw0rd"),
           "missing database": pg_server.url("no_such_db"),
           "unreachable": f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/{db}",
           "TLS refused": pg_url + "?sslmode=require"}[case]
    res = ctl(url, "migrate")
    assert res.returncode == 1, res.stderr
    assert res.stderr.startswith("jobq-ctl: error: PostgreSQL: cannot connect to 127.0.0.1:")
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert PASSWORD not in res.stderr + res.stdout and "Wr0ngPassw0rd" not in res.stderr


def test_migrate_needs_backend_postgres() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "JOBQ_"))}
    res = subprocess.run([*command("jobq-ctl"), "--sqlite-path", "/nonexistent/x.db",
                          "migrate"], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2
    assert res.stderr == ("jobq-ctl: error: migrate: only for --backend postgres (the sqlite "
                          "backend creates what it needs itself)\n")


def _hot_updates(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE "
                        "schemaname = 'jobq' AND relname = 'jobs'").fetchone()


def test_a_heartbeat_is_a_hot_update(pg_url) -> None:
    """1,000 renewals of one running row, as a lease does it (only locked_until changes):
    every one is HOT.  The same with an index on locked_until: none is (the check can fail)."""
    n = 1000
    with psycopg.connect(pg_url, autocommit=True) as conn:
        sc.migrate(conn, "jobq")
        conn.execute("INSERT INTO jobq.jobs (id, queue, state, body, owner, attempt, "
                     "locked_until, started_at) VALUES ('t1', 'q', 'running', '{}', 'w1', 1, "
                     "now() + interval '5 minutes', now())")

        def renew_all() -> None:
            for _ in range(n):
                conn.execute("UPDATE jobq.jobs SET locked_until = now() + interval "
                             "'5 minutes' WHERE id = %s AND owner = %s AND attempt = %s AND "
                             "state = 'running'", ("t1", "w1", 1))
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.execute("SELECT 1")  # the flush happens at the end of a statement

        with psycopg.connect(pg_url, autocommit=True) as reader:
            renew_all()
            assert wait_for(lambda: _hot_updates(reader)[0] >= n, 30,
                            what="the statistics of 1000 updates")
            assert _hot_updates(reader) == (n, n)
            conn.execute("CREATE INDEX jobs_locked_until ON jobq.jobs (locked_until)")
            renew_all()
            assert wait_for(lambda: _hot_updates(reader)[0] >= 2 * n, 30,
                            what="the statistics of 2000 updates")
            assert _hot_updates(reader) == (2 * n, n)


def test_control_migration_makes_the_control_store_tables(pg_url) -> None:
    """The control store's table compares its keys byte by byte whatever the database's
    collation, and has its sequence; the printed script holds it too."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        sc.migrate(conn, "jobq")
        collations = dict(conn.execute(
            "SELECT a.attname, c.collname FROM pg_attribute a JOIN pg_collation c ON "
            "c.oid = a.attcollation WHERE a.attrelid = 'jobq.control_records'::regclass "
            "AND a.attname IN ('part', 'row')").fetchall())
        assert collations == {"part": "C", "row": "C"}
        assert conn.execute("SELECT nextval('jobq.control_rev')").fetchone()[0] >= 1
    cols = {c for t, c, *_ in fingerprint(pg_url)["columns"] if t == "control_records"}
    assert cols == {"part", "row", "kind", "at", "rev", "expires", "doc"}
    printed = ctl("", "migrate", "--print").stdout
    assert "CREATE TABLE IF NOT EXISTS \"jobq\".control_records" in printed
    assert "CREATE SEQUENCE IF NOT EXISTS \"jobq\".control_rev" in printed


def test_a_version_1_database_upgrades_in_place(pg_url) -> None:
    """A database that a jobq-supervisor of migration 1 made (with a task in it) is brought
    to the latest version by a worker's check, its rows kept (the control store's and the
    output store's tables made); a read-only check before that says it is older and creates
    nothing; ``--print`` has the output tables."""
    t = sc.Tables.of("jobq")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        with conn.transaction():
            for stmt in sc.MIGRATIONS[0](t):
                conn.execute(stmt)
            conn.execute(sc._set_version(t, 1))
        conn.execute("INSERT INTO jobq.jobs (id, queue, body) VALUES ('t1', 'q', '{}')")
        with pytest.raises(QueueNotFound) as info:
            sc.check_schema(conn, "jobq", create=False)
        assert f"is at version 1, older than this jobq-supervisor's ({LATEST})" in str(
            info.value)
        assert conn.execute("SELECT to_regclass('jobq.control_records')").fetchone() == (None,)
        assert sc.check_schema(conn, "jobq", create=True) == LATEST
        assert sc.read_version(conn, "jobq") == LATEST
        assert conn.execute("SELECT id FROM jobq.jobs").fetchall() == [("t1",)]
        assert conn.execute("SELECT count(*) FROM jobq.control_records").fetchone() == (0,)
    fp = fingerprint(pg_url)
    cols = {(tb, c) for tb, c, *_ in fp["columns"]}
    assert {("outputs", c) for c in ("queue", "task_id", "attempt", "run", "size", "complete",
                                     "updated_at")} <= cols
    assert {("output_chunks", c) for c in ("queue", "task_id", "attempt", "pos", "data")} \
        <= cols
    assert "(updated_at)" in dict(fp["indexes"])["outputs_updated"]
    assert "fillfactor=70" in dict(fp["reloptions"])["outputs"]
    printed = ctl("", "migrate", "--print").stdout
    assert "output_chunks" in printed and "-- migration 1\n" in printed
    assert sc.output_channel("jobq") == "jobq.output"
    with psycopg.connect(pg_url, autocommit=True) as conn:  # lz4: Debian's server has it
        assert conn.execute("SELECT attcompression FROM pg_attribute WHERE attrelid = "
                            "'jobq.output_chunks'::regclass AND attname = 'data'"
                            ).fetchone() == ("l",)
