"""The expired-lease reaper (supervisor/backends/postgres/reaper.py) on a real server: which
leases it takes back and where they go, that one pass is one statement when nothing expired,
its schedule and back-off, and that reapers at once take each lease back exactly once."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

import psycopg
import pytest

from supervisor.backends.postgres.connect import failure
from supervisor.backends.postgres.reaper import ExpiredLeaseReaper
from supervisor.backends.postgres.schema import Tables, migrate, wake_channel
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(120)

SCHEMA = "jobq"


class Db:
    """The reaper's view of a backend's database (backends/postgres/reaper.py: Database),
    over real connections to the test's database; ``statements`` counts what the reaper
    sent, ``fail`` makes its statements fail as a server error would."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.schema = SCHEMA
        self.tables = Tables.of(SCHEMA)
        self.wake_channel = wake_channel(SCHEMA)
        self.statements = 0
        self.fail = False

    @contextlib.contextmanager
    def main(self, what: str = "test") -> Iterator[Counting]:
        """As db.Database.main: psycopg's errors -> BackendError (connect.failure)."""
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                yield Counting(conn, self)
        except psycopg.Error as exc:
            raise failure(exc, what, self.url) from None

    def table(self, name: str) -> str:
        return f'"{SCHEMA}".{name}'


class Counting:
    """A real connection that counts the statements sent through it."""

    def __init__(self, conn: psycopg.Connection, db: Db) -> None:
        self.conn, self.db = conn, db

    def transaction(self):
        return self.conn.transaction()

    def execute(self, sql, args=()):
        self.db.statements += 1
        if self.db.fail:
            return self.conn.execute("SELECT 1/0")
        return self.conn.execute(sql, args)


@pytest.fixture
def db(pg_url) -> Db:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        migrate(conn, SCHEMA)
    return Db(pg_url)


def add(db: Db, task_id: str, *, attempt: int = 1, expired_ago: float | None = 5.0,
        owner: str = "w1#n1", worker: str = "w1", queue: str = "q",
        max_attempts: int | None = None, body: str | None = None) -> None:
    """A running row (``expired_ago``: its lock's end that long ago; negative: ahead), or a
    pending one (None)."""
    if body is None:
        task = {"cmd": "true", "id": task_id}
        if max_attempts is not None:
            task["max_attempts"] = max_attempts
        body = json.dumps(task)
    with db.main() as conn:
        if expired_ago is None:
            conn.execute(f"INSERT INTO {db.table('jobs')} (id, queue, state, body, attempt) "
                         "VALUES (%s, %s, 'pending', %s, %s)", (task_id, queue, body, attempt))
            return
        conn.execute(
            f"INSERT INTO {db.table('jobs')} (id, queue, state, body, attempt, owner, worker, "
            "started_at, locked_until) VALUES (%s, %s, 'running', %s, %s, %s, %s, now(), "
            "now() - make_interval(secs => %s))",
            (task_id, queue, body, attempt, owner, worker, expired_ago))


def rows(db: Db) -> dict[str, tuple]:
    with db.main() as conn:
        return {r[0]: r[1:] for r in conn.execute(
            f"SELECT id, state, attempt, owner, locked_until IS NULL, worker, reason, "
            f"ended_at IS NOT NULL FROM {db.table('jobs')} ORDER BY id")}


def reaper(db: Db, **kw) -> ExpiredLeaseReaper:
    kw.setdefault("max_attempts", 3)
    kw.setdefault("interval", 10.0)
    kw.setdefault("stale_age", 0.0)
    return ExpiredLeaseReaper(db, "q", **kw)


def test_expired_leases_go_back_to_pending_or_fail_on_their_last_attempt(db, caplog):
    add(db, "a-expired", attempt=1)
    add(db, "b-alive", attempt=1, expired_ago=-60)  # renewed: its lock ends in a minute
    add(db, "c-last", attempt=3)  # the worker's --max-attempts 3: its last
    add(db, "d-own-max", attempt=1, max_attempts=1)  # the task's own max_attempts
    add(db, "e-own-more", attempt=3, max_attempts=5)
    add(db, "f-poison", attempt=3, body="{not json")
    add(db, "g-other-queue", queue="other")
    add(db, "h-pending", expired_ago=None, attempt=0)
    before = rows(db)
    taken = reaper(db).reap()
    assert sorted((t.id, t.worker, t.status) for t in taken) == [
        ("a-expired", "w1", "pending"), ("c-last", "w1", "failed"),
        ("d-own-max", "w1", "failed"), ("e-own-more", "w1", "pending"),
        ("f-poison", "w1", "failed")]
    after = rows(db)
    reason = "lease expired on the last attempt (worker w1 stopped renewing)"
    # pending again: no owner, no lock, no worker; the attempt the dead run took stays
    # counted (the next receive makes it attempt 2)
    assert after["a-expired"] == ("pending", 1, None, True, None, None, False)
    assert after["e-own-more"] == ("pending", 3, None, True, None, None, False)
    for failed, attempt in (("c-last", 3), ("d-own-max", 1), ("f-poison", 3)):
        assert after[failed] == ("failed", attempt, None, True, "w1", reason, True)
    for untouched in ("b-alive", "g-other-queue", "h-pending"):
        assert after[untouched] == before[untouched]
    assert "lease expired: worker w1 stopped renewing: took back 5 running task(s)" \
        in caplog.text
    assert reaper(db).reap() == []


def test_stale_lock_age_waits_that_long_after_the_locks_end(db):
    add(db, "recent", expired_ago=2.0)
    add(db, "old", expired_ago=20.0)
    assert [t.id for t in reaper(db, stale_age=10.0).reap()] == ["old"]
    assert rows(db)["recent"][0] == "running"


def test_a_pass_while_another_workers_reaper_holds_the_queue_is_skipped(db):
    add(db, "x")
    r = reaper(db)
    with psycopg.connect(db.url) as other, other.transaction():
        other.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (r.lock_name,))
        assert r.reap() == []  # at once: try-lock, never a wait
        assert rows(db)["x"][0] == "running"
    assert [t.id for t in r.reap()] == ["x"]


def test_a_pass_that_finds_nothing_is_one_statement(db, pg_url):
    """Nearly every pass finds nothing expired: then it is one statement (its transaction's
    BEGIN and COMMIT aside), and while another worker's reaper holds the queue's lock that
    statement reads no row of the table (a one-time filter)."""
    add(db, "alive", expired_ago=-60)
    r = reaper(db)
    db.statements = 0
    assert r.reap() == [] and db.statements == 1
    assert rows(db)["alive"][0] == "running"
    add(db, "gone")
    db.statements = 0
    # + the UPDATE, and the NOTIFY that wakes idle workers
    assert [t.id for t in r.reap()] == ["gone"] and db.statements == 3
    with psycopg.connect(pg_url, autocommit=True) as conn:
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN WITH l AS MATERIALIZED (SELECT pg_try_advisory_xact_lock(1) AS got) "
            f"SELECT id FROM {db.table('jobs')} WHERE (SELECT got FROM l) AND queue='q' AND "
            "state='running' AND locked_until < now() FOR UPDATE SKIP LOCKED"))
    assert "One-Time Filter" in plan


def test_maintenance_keeps_the_interval(db):
    clock = FakeClock()
    r = reaper(db, interval=10.0, clock=clock)
    add(db, "one")
    assert [t.id for t in r.maintenance()] == ["one"]  # the first pass at once
    add(db, "two")
    clock.advance(9.0)
    assert r.maintenance() == []  # not due yet
    clock.advance(1.0)
    assert [t.id for t in r.maintenance()] == ["two"]
    assert r.taken_back == 2
    add(db, "three")
    assert reaper(db, interval=0.0, clock=clock).maintenance() == []  # 0: never
    assert rows(db)["three"][0] == "running"


def test_a_failed_pass_backs_off_and_says_so(db, caplog):
    clock = FakeClock()
    add(db, "x")
    r = reaper(db, interval=30.0, clock=clock)
    db.fail = True
    assert r.maintenance() == []
    assert "expired-lease reaper skipped this round (next try in 5s): PostgreSQL: " \
        "expired-lease pass: division by zero" in caplog.text
    clock.advance(4.9)
    db.fail = False
    assert r.maintenance() == []  # backing off
    clock.advance(0.1)
    assert [t.id for t in r.maintenance()] == ["x"]
    assert r.next_pass == clock() + 30.0


@pytest.mark.parametrize("lock", ["one lock", "no common lock"])
def test_reapers_at_once_take_each_lease_back_exactly_once(db, lock):
    """Four reapers at once, in small batches: under the queue's lock they take turns;
    without it (``no common lock``: each its own) SKIP LOCKED and the fence still give each
    lease to exactly one of them."""
    n = 300
    with db.main() as conn:
        conn.execute(
            f"INSERT INTO {db.table('jobs')} (id, queue, state, body, attempt, owner, worker, "
            "locked_until) SELECT 't' || lpad(i::text, 4, '0'), 'q', 'running', "
            "'{\"cmd\": \"true\"}', 1, 'dead#1', 'dead', now() - interval '1 second' "
            "FROM generate_series(1, %s) AS i", (n,))
    taken: list[list[str]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def run(i: int) -> None:
        r = reaper(db, batch=7)  # many small passes, so that they interleave
        if lock == "no common lock":
            r.lock_name += f" {i}"
        start.wait()
        for _ in range(400):
            got = r.reap()
            taken[i].extend(t.id for t in got)
            if sum(len(t) for t in taken) >= n:
                return

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [tid for one in taken for tid in one]
    assert len(every) == n and len(set(every)) == n
    assert {r[0] for r in rows(db).values()} == {"pending"}


def test_leases_back_to_pending_wake_the_idle_workers(db):
    """The pass NOTIFYs the queue when it put leases back to pending (idle workers start
    them at once), and not when it only failed some."""
    with psycopg.connect(db.url, autocommit=True) as listening:
        listening.execute(f'LISTEN "{db.wake_channel}"')
        add(db, "last", attempt=3)
        assert [t.status for t in reaper(db).reap()] == ["failed"]
        assert list(listening.notifies(timeout=0.5)) == []
        add(db, "again")
        assert [t.status for t in reaper(db).reap()] == ["pending"]
        assert [n.payload for n in listening.notifies(timeout=5, stop_after=1)] == ["q"]


def test_a_workers_maintenance_takes_expired_leases_back(pg_url, close_at_end):
    """Through the worker's backend (open_backend): the pass runs from ``maintenance`` with
    the backend's defaults (every 10 s, stale age 0), a lease it took back is "coming back"
    until the next receive, and a lost lease comes back within the interval; jobq-ctl
    runs no pass."""
    from supervisor.core.task import Task
    from tests.postgres.queue import open_queue

    worker = close_at_end(open_queue(pg_url, "q", "w1"))
    ctl = close_at_end(open_queue(pg_url, "q", for_ctl=True))
    assert worker.lost_lease_return_delay == 10.0
    ctl.push([Task(cmd="true", id="t1")])
    (lease,) = worker.receive(1, 30.0)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE jobq.jobs SET locked_until = now() - interval '1 second'")
    ctl.maintenance()
    worker.maintenance()
    assert worker.leases_coming_back()
    (again,) = worker.receive(1, 30.0)
    assert (again.message_id, again.attempt) == ("t1", 2)
    assert not worker.leases_coming_back()
