"""The PostgreSQL queue through a real PgBouncer in transaction pooling mode with
``--postgres-notify off`` (``pgb`` fixture: tests/postgres/bouncer.py): real workers drain
tasks, ``jobq-ctl`` works, ``migrate`` serialises on its transaction-level advisory lock, the
reaper takes a dead worker's task back, and a long task keeps its lease across renewals.

The bouncer hands each transaction to the next of three server connections in turn, so
whatever relied on session state (a prepared statement, a session advisory lock, ``SET``)
fails here; ``test_the_bouncer_pools_by_transaction`` shows that it really does."""

from __future__ import annotations

import json
import signal

import psutil
import psycopg
import pytest

from supervisor.backends.postgres import schema as sc
from supervisor.backends.postgres.connect import POOLER_HINT, execute, failure
from tests.conftest import wait_for
from tests.integration.helpers import beating_task, kill_and_watch, long_sleeps, runs
from tests.postgres.bouncer import POOL_SIZE, PgBouncer
from tests.postgres.env import PgEnv
from tests.postgres.server import wait_port_closed
from tests.postgres.test_schema import popen_ctl

pytestmark = pytest.mark.timeout(180)

POLL = "0.2"


def test_the_bouncer_pools_by_transaction(pg_bouncer: PgBouncer, bouncer_url: str) -> None:
    """The fixture is what the tests need: transaction pooling, one client's transactions on
    several server connections, and a prepared statement of one transaction gone in the
    next (what ``prepare_threshold=None`` avoids)."""
    config = {row[0]: row[1] for row in pg_bouncer.show("CONFIG")}
    assert config["pool_mode"] == "transaction"
    with psycopg.connect(bouncer_url, autocommit=True, prepare_threshold=None) as conn:
        pids = {conn.execute("SELECT pg_backend_pid()").fetchone()[0] for _ in range(12)}
        assert len(pids) == POOL_SIZE, pids
    with psycopg.connect(bouncer_url, autocommit=True, prepare_threshold=0) as conn:
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            for _ in range(12):
                conn.execute("SELECT pg_backend_pid()")


def test_a_closed_bouncer_leaves_nothing_behind(pg_server) -> None:
    """The fixture's promise: close() ends runuser and pgbouncer, frees the port, removes
    the folder -- with a client still connected."""
    bouncer = PgBouncer(pg_server)
    try:
        bouncer.start()
        procs = bouncer.processes()
        assert any(p.name() == "pgbouncer" for p in procs), procs
        client = psycopg.connect(bouncer.url("postgres"), autocommit=True)
        assert client.execute("SELECT 1").fetchone() == (1,)
    finally:
        bouncer.close()
    client.close()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    assert wait_port_closed(bouncer.port) and not bouncer.root.exists()

def test_statement_timeouts_stay_in_their_transaction(bouncer_url: str) -> None:
    """``execute``'s statement timeout is ``SET LOCAL``: it holds for its statement through
    the bouncer and leaks into no other client's transaction on the same server
    connections (a session ``SET`` would)."""
    with psycopg.connect(bouncer_url, autocommit=True, prepare_threshold=None) as conn, \
            psycopg.connect(bouncer_url, autocommit=True, prepare_threshold=None) as other:
        for _ in range(2 * POOL_SIZE):  # every server connection had one
            with pytest.raises(psycopg.errors.QueryCanceled):
                execute(conn, "SELECT pg_sleep(5)", timeout=0.2)
        seen = {other.execute("SELECT current_setting('statement_timeout'), "
                              "pg_backend_pid()").fetchone() for _ in range(4 * POOL_SIZE)}
    assert {setting for setting, _pid in seen} == {"0"}
    assert len({pid for _setting, pid in seen}) == POOL_SIZE

def test_workers_drain_tasks_each_exactly_once(pgb: PgEnv) -> None:
    done = pgb.tmp / "done"
    pgb.serve()
    ids = pgb.push(*(f"echo $JOBQ_TASK_ID >> {done}" for _ in range(40)))
    [bad] = pgb.push("echo 'the last words'; exit 3", extra=("--max-attempts", "1"))
    assert pgb.ctl("size").stdout == "41\n"
    assert [line.split()[0] for line in pgb.ctl("peek").stdout.splitlines()] == (ids + [bad])[:10]
    sups = [pgb.supervisor("-n", "3", "--exit-when-empty", "--poll-interval", POLL,
                           "--worker-id", f"w{i}") for i in range(2)]
    assert [sup.wait(120) for sup in sups] in ([4, 0], [0, 4]), [s.log() for s in sups]
    ran = done.read_text().split()
    assert sorted(ran) == sorted(ids), "a task ran twice or never"
    assert pgb.rows("SELECT state, attempt, count(*) FROM jobq.jobs WHERE id <> %s "
                    "GROUP BY 1, 2", (bad,)) == [("succeeded", 1, 40)]
    for sup in sups:  # no backend error, retried or not
        assert "PostgreSQL: " not in sup.log() and "prepared" not in sup.log(), sup.log()
    assert pgb.ctl("size").stdout == "0\n"
    [failed] = json.loads(pgb.ctl("failed", "--json").stdout)
    assert failed["id"] == bad and "the last words" in json.dumps(failed)


def test_status_shows_a_running_task_and_its_lease_is_renewed(pgb: PgEnv) -> None:
    """A long task keeps its lease across several renewals (a 3 s lease, renewed every
    second; the task runs until the test has seen its ``locked_until`` move three times),
    and ``jobq-ctl status`` shows it running."""
    started, release = pgb.tmp / "started", pgb.tmp / "release"
    pgb.serve()
    [tid] = pgb.push(f"touch {started}; while [ ! -e {release} ]; do sleep 0.1; done")
    sup = pgb.supervisor("-n", "1", "--poll-interval", POLL, "--lock-duration", "3s",
                         "--exit-when-empty")
    wait_for(started.exists, 60, what=f"the task to start\n{sup.log()}")
    seen = set()

    def renewed_three_times() -> bool:
        job = pgb.job(tid)
        assert (job["state"], job["attempt"]) == ("running", 1), job
        seen.add(job["locked_until"])
        return len(seen) >= 4  # the first lock and three renewals

    wait_for(renewed_three_times, 90, what=f"three renewals\n{sup.log()}")
    [running] = json.loads(pgb.ctl("status", "--json").stdout)["running"]
    assert running["id"] == tid and running["attempt"] == 1
    release.touch()
    assert sup.wait(60) == 0, sup.log()
    job = pgb.job(tid)
    assert (job["state"], job["attempt"]) == ("succeeded", 1), job
    assert "lock_lost=0" in sup.log() and "_pg3_" not in sup.log(), sup.log()


def test_the_reaper_takes_a_killed_workers_task_back(pgb: PgEnv) -> None:
    """A SIGKILLed worker's task is taken back by another worker's reaper (its
    transaction-level advisory lock held through the bouncer) and runs again."""
    log = pgb.tmp / "runs"
    pgb.serve()
    [tid] = pgb.push(beating_task(log))
    sup = pgb.supervisor("-n", "1", "--lock-duration", "5s", name="killed")
    wait_for(lambda: long_sleeps() == 2 and runs(log).get(1), 60,
             what=f"the task running\n{sup.log()}")
    other = pgb.supervisor("-n", "1", "--lock-duration", "5s", "--reaper-interval", "1s",
                           "--poll-interval", POLL, name="other")
    other.wait_log(" started: ", 60)
    kill_and_watch(sup)
    wait_for(lambda: 2 in runs(log), 60, what=f"the second run\n{other.log()}")
    wait_for(lambda: pgb.job(tid)["state"] == "succeeded", 60, what="succeeded")
    assert pgb.job(tid)["attempt"] == 2
    other.signal(signal.SIGTERM)
    assert other.wait(30) == 0
    assert "stopped renewing: took back 1 running task(s)" in other.log()


def test_concurrent_migrates_through_the_bouncer(pg_server, pg_url: str,
                                                 bouncer_url: str) -> None:
    """``jobq-ctl migrate`` through the bouncer: its transaction-level advisory lock holds
    for its whole transaction (three of them wait on a lock the test holds on the server
    directly), and each exits 0, one having created the schema."""
    with psycopg.connect(pg_url, autocommit=True) as holder:
        with holder.transaction():
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (sc.lock_key("jobq"),))
            procs = [popen_ctl(bouncer_url, "--postgres-notify", "off", "migrate")
                     for _ in range(POOL_SIZE)]
            wait_for(lambda: holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()[0] == POOL_SIZE, 60, what="the migrates waiting on the lock")
        outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * POOL_SIZE, outs
    assert sorted(out for out, _err in outs) == [
        f"schema jobq: at version {sc.LATEST} already\n"] * (POOL_SIZE - 1) + [
        f"schema jobq: created at version {sc.LATEST}\n"]



def lost_prepared(url: str) -> psycopg.Error:
    """The error a connection to ``url`` that prepares every statement meets (none: None)."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        try:
            for _ in range(12):
                conn.execute("SELECT pg_backend_pid()")
        except psycopg.Error as exc:
            return exc
    raise AssertionError("no statement was lost")


def test_a_lost_prepared_statement_names_the_pooler_and_the_setting(
        pg_url: str, bouncer_url: str) -> None:
    """Through a transaction pooler a statement psycopg prepared goes missing: the one-line
    error says why and what to set; a server's own error about a prepared statement does not
    get the hint."""
    message = str(failure(lost_prepared(bouncer_url), "receive", bouncer_url))
    assert message.startswith("PostgreSQL: receive: prepared statement \"_pg3_")
    assert message.endswith(POOLER_HINT) and "--postgres-notify off" in message
    assert "\n" not in message and "pg-test-s3cret" not in message
    with psycopg.connect(pg_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidSqlStatementName) as raised:
            conn.execute("EXECUTE nosuch")
    assert POOLER_HINT not in str(failure(raised.value, "receive", pg_url))


def test_notify_on_through_the_bouncer_tells_what_to_set(pgb: PgEnv) -> None:
    """``--postgres-notify on`` (the default) through PgBouncer in transaction mode: psycopg
    prepares statements and soon one is missing; the worker's warning names the pooler and
    ``--postgres-notify off`` instead of a bare "prepared statement does not exist"."""
    pgb.serve()
    pgb.push(*(f"echo {i}" for i in range(30)))
    sup = pgb.supervisor("-n", "3", "--poll-interval", POLL, "--postgres-notify", "on")
    sup.wait_log('"_pg3_', 90)
    # Not a graceful stop: its settlements may be retried for long, each try a toss-up of
    # which server connection it reaches (what the operator is told to fix).
    sup.stop()
    warnings = [line for line in sup.log().splitlines() if '"_pg3_' in line]
    assert all(POOLER_HINT in line for line in warnings), warnings
