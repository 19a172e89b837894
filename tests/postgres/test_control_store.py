"""The control store on PostgreSQL (fleet/control/postgres.py) beyond the ControlStore contract
(tests/control/test_contract.py runs that on it): the poll's cursor against cancels committed
out of sequence order, NOTIFY in the write's transaction, read-only opens, one-line errors;
and the fleet commands of ``jobq-ctl`` against a real worker."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest

from supervisor.backends.postgres.schema import control_channel, migrate
from supervisor.fleet.control import Cancel, ControlStoreError, QueueFlag, WorkerRecord
from supervisor.fleet.control.postgres import PostgresControlStore
from tests.conftest import term_stamp, wait_for
from tests.integration.helpers import FAST
from tests.postgres.env import PgEnv
from tests.postgres.server import PASSWORD

pytestmark = pytest.mark.timeout(120)
Q = "default"
NOW = 1_700_000_000.0


def _cancel(task_id: str) -> Cancel:
    return Cancel(queue=Q, task_id=task_id, reason="r", who="ops", when=NOW)


@pytest.fixture
def store(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        migrate(conn, "jobq")
    s = PostgresControlStore(pg_url)
    yield s
    s.close()


def waiters(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]


def test_a_cancel_committed_after_a_later_one_is_not_missed(pg_url, store) -> None:
    """Cancel "slow" takes its rev, then waits (a row lock the test holds) before it
    commits; cancel "fast", written meanwhile, must not commit with a higher rev first: a
    poll would move its cursor past "slow" for ever."""
    with psycopg.connect(pg_url) as blocker:  # holds the row "slow" will upsert
        blocker.execute("INSERT INTO jobq.control_records (part, row, kind, at, rev, doc) "
                        "VALUES ('q:default', 'cancel:slow', 'cancel', 0, 0, '')")
        slow = threading.Thread(target=lambda: PostgresControlStore(pg_url, timeout=30).put_cancel(
            _cancel("slow")))
        slow.start()
        with psycopg.connect(pg_url, autocommit=True) as watch:
            wait_for(lambda: waiters(watch) == 1, 30, what="the slow cancel waiting")
            fast_store = PostgresControlStore(pg_url, timeout=30)
            fast = threading.Thread(target=lambda: fast_store.put_cancel(_cancel("fast")))
            fast.start()
            # the fast one waits for the slow one's commit (or, without the lock, is done)
            wait_for(lambda: waiters(watch) == 2 or not fast.is_alive(), 30,
                     what="the fast cancel done or waiting")
            first = store.poll(Q, "w1")
        blocker.rollback()
    slow.join(30)
    fast.join(30)
    fast_store.close()
    seen = {c.task_id for c in first.cancels}
    seen |= {c.task_id for c in store.poll(Q, "w1", first.cursor).cancels}
    assert seen == {"slow", "fast"}


def test_cancel_flag_and_command_notify_in_their_transaction(pg_url, store) -> None:
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{control_channel("jobq")}"')
        store.put_worker(WorkerRecord(id="w1", queue=Q, host="h", pid=1, version="0",
                                      state="running", slots_used=0, slots_total=1,
                                      started=NOW, heartbeat=NOW))
        store.put_cancel(_cancel("t1"))
        store.put_flag(QueueFlag(queue="other", paused=True, who="ops", when=NOW))
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=2)]
        assert got == [("jobq.control", Q), ("jobq.control", "other")]
        assert list(listener.notifies(timeout=0.5)) == []  # the worker record sent none


def test_read_only_open_creates_nothing_and_errors_are_one_line(pg_server, pg_url) -> None:
    with pytest.raises(ControlStoreError) as info:
        PostgresControlStore(pg_url, create=False)
    assert "schema jobq does not exist" in str(info.value)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'jobq'"
                            ).fetchone() == (0,)
    bad = pg_server.url(pg_url.rsplit("/", 1)[1], password="Wr0ngPassw0rd")
    with pytest.raises(ControlStoreError) as info:
        PostgresControlStore(bad)
    text = str(info.value)
    assert text.startswith("control store: PostgreSQL: cannot connect to 127.0.0.1:")
    assert "\n" not in text and "Wr0ngPassw0rd" not in text and PASSWORD not in text


def test_a_store_reconnects_after_a_server_restart(pg_server, store) -> None:
    store.put_cancel(_cancel("t1"))
    pg_server.restart()
    with pytest.raises(ControlStoreError):  # the broken connection: one failed call
        store.get_cancel(Q, "t1")
    assert store.get_cancel(Q, "t1") == _cancel("t1")


# ------------------------------------------------------------------ jobq-ctl, real worker
def test_fleet_commands_on_a_real_worker(pg: PgEnv) -> None:
    """workers, status (the worker of a running task), pause/resume, cancel (SIGTERM, failed
    as cancelled), result, drain and push --wait, all through jobq-ctl."""
    marker, ready = pg.tmp / "term", pg.tmp / "ready"
    [tid] = pg.push(f"{term_stamp(marker)}; touch {ready}; sleep 600 & wait")
    sup = pg.supervisor("-n", "2", "--worker-id", "pg-w1", "--poll-interval", "0.2", *FAST)
    wait_for(ready.exists, 60, what="task running")
    wait_for(lambda: [w["id"] for w in json.loads(pg.ctl("workers", "--json").stdout)]
             == ["pg-w1"], 30, what="the worker record")
    status = json.loads(pg.ctl("status", "--json").stdout)
    [run] = status["running"]
    assert (run["id"], run["worker"]) == (tid, "pg-w1")
    assert "pg-w1" in pg.ctl("status").stdout

    pg.ctl("pause")
    wait_for(lambda: json.loads(pg.ctl("workers", "--json").stdout)[0]["state"] == "paused",
             30, what="the worker paused")
    assert json.loads(pg.ctl("status", "--json").stdout)["paused"] is True
    pg.ctl("resume")
    wait_for(lambda: json.loads(pg.ctl("workers", "--json").stdout)[0]["state"] == "running",
             30, what="the worker running again")

    t0 = time.time()
    pg.ctl("cancel", tid, "--reason", "wrong input")
    wait_for(marker.exists, 30, what="SIGTERM of the cancelled task")
    assert float(marker.read_text()) - t0 < 1.0 + 2.0 + 5.0  # control interval + 2 s, + slack
    wait_for(lambda: pg.job(tid)["state"] == "failed", 30, what="failed as cancelled")
    assert pg.job(tid)["reason"].startswith("cancelled by")
    wait_for(lambda: "cancelled" in pg.ctl("result", tid, check=False).stdout, 30,
             what="the result record")

    waited = pg.ctl("push", "--wait", "-c", "echo waited-for")
    assert waited.returncode == 0, waited.stderr

    pg.ctl("drain", "pg-w1")
    assert sup.wait(60) == 0, sup.log()
    assert "drained by" in sup.log()
    assert json.loads(pg.ctl("workers", "--json").stdout) == []
