"""The SQLite backend on real files in tmp_path: leases, fencing, settlement, the reaper."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from supervisor.backends.base import BackendConfigError, BackendError, LeaseLost
from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.task import Task
from supervisor.worker.settle_steps import DeadLetter
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(30)

LOCK = 60.0


@pytest.fixture
def open_backend(db, close_at_end) -> Callable[..., SqliteBackend]:
    def make(worker: str = "A", **kwargs) -> SqliteBackend:
        return close_at_end(SqliteBackend(db, "default", worker, **kwargs))

    return make


@pytest.fixture
def a(open_backend) -> SqliteBackend:
    return open_backend("A")


@pytest.fixture
def raw(db, a) -> Iterator[sqlite3.Connection]:
    """A plain connection for inspecting and rigging rows (after the schema exists)."""
    conn = sqlite3.connect(db, isolation_level=None)
    yield conn
    conn.close()


def row(conn: sqlite3.Connection, job_id: str) -> dict:
    cur = conn.execute("SELECT * FROM jobs WHERE id=?", (job_id,))
    names = [d[0] for d in cur.description]
    values = cur.fetchone()
    assert values is not None, f"no job {job_id}"
    return dict(zip(names, values))


def expire(conn: sqlite3.Connection, job_id: str, ago: float = 10.0) -> None:
    conn.execute("UPDATE jobs SET locked_until=? WHERE id=?", (time.time() - ago, job_id))


def push(backend: SqliteBackend, *cmds: str, **kwargs) -> list[Task]:
    tasks = [Task(cmd=c, **kwargs) for c in cmds]
    assert backend.push(tasks) == [t.id for t in tasks]
    return tasks


# --------------------------------------------------------------------------- basics
def test_push_receive_complete(a, raw) -> None:
    (task,) = push(a, "echo hi")
    assert a.size() == 1
    (lease,) = a.receive(5, LOCK)
    assert lease.task == task
    assert lease.message_id == task.id
    assert lease.attempt == 1
    assert lease.format_error is None
    assert a.size() == 0
    lease.complete()
    r = row(raw, task.id)
    assert r["status"] == "succeeded"
    assert r["locked_by"] == "A"  # the worker that ran it last
    assert r["locked_until"] is None
    assert a.receive(5, LOCK) == []
    assert a.status().counts == {"pending": 0, "delayed": 0, "running": 0, "succeeded": 1,
                                 "failed": 0}


def test_receive_takes_max_messages_in_push_order(a, raw) -> None:
    tasks = push(a, *(f"echo {i}" for i in range(5)))
    before = time.time()
    leases = a.receive(3, LOCK)
    assert [le.message_id for le in leases] == [t.id for t in tasks[:3]]
    for le in leases:
        r = row(raw, le.message_id)
        assert r["status"] == "running"
        assert r["attempt"] == 1
        assert r["locked_by"] == "A"
        assert before + LOCK - 1 <= r["locked_until"] <= time.time() + LOCK + 1
        assert le.lock_duration == LOCK
    assert row(raw, tasks[3].id)["status"] == "pending"
    rest = a.receive(10, LOCK)
    assert [le.message_id for le in rest] == [t.id for t in tasks[3:]]


def test_a_second_worker_never_receives_a_running_job(open_backend, a) -> None:
    b = open_backend("B")
    tasks = push(a, "one", "two", "three")
    mine = a.receive(2, LOCK)
    theirs = b.receive(10, LOCK)
    assert [le.message_id for le in theirs] == [tasks[2].id]
    assert b.receive(10, LOCK) == []
    assert a.receive(10, LOCK) == []
    assert {le.message_id for le in mine} == {tasks[0].id, tasks[1].id}


def test_renew_extends_locked_until(a, raw) -> None:
    (task,) = push(a, "true")
    (lease,) = a.receive(1, LOCK)
    raw.execute("UPDATE jobs SET locked_until=? WHERE id=?", (time.time() + 5, task.id))
    before = time.time()
    assert lease.renew(5.0) == LOCK
    r = row(raw, task.id)
    assert r["locked_until"] >= before + LOCK
    assert r["status"] == "running"


# --------------------------------------------------------------------------- fencing
SETTLEMENTS = {
    "renew": lambda le: le.renew(5.0),
    "complete": lambda le: le.complete(),
    "release": lambda le: le.release(True),
    "release-preempted": lambda le: le.release(False),
    "dead_letter": lambda le: le.dead_letter("boom", "tail", 1),
}


@pytest.mark.parametrize("op", list(SETTLEMENTS), ids=list(SETTLEMENTS))
def test_fencing_after_reap_and_redelivery(open_backend, a, raw, op) -> None:
    (task,) = push(a, "sleep 1000")
    (lease_a,) = a.receive(1, LOCK)
    expire(raw, task.id)
    b = open_backend("B", stale_lock_age=0.0)
    assert b.reap() == 1
    (lease_b,) = b.receive(1, LOCK)
    assert lease_b.attempt == 2
    snapshot = row(raw, task.id)
    assert snapshot["locked_by"] == "B"
    with pytest.raises(LeaseLost):
        SETTLEMENTS[op](lease_a)
    assert row(raw, task.id) == snapshot  # worker A changed nothing
    lease_b.complete()  # the new holder still can
    assert row(raw, task.id)["status"] == "succeeded"


@pytest.mark.parametrize("op", list(SETTLEMENTS), ids=list(SETTLEMENTS))
def test_fencing_after_reap_before_redelivery(open_backend, a, raw, op) -> None:
    (task,) = push(a, "sleep 1000")
    (lease_a,) = a.receive(1, LOCK)
    expire(raw, task.id)
    assert open_backend("B", stale_lock_age=0.0).reap() == 1
    snapshot = row(raw, task.id)
    assert snapshot["status"] == "pending"
    with pytest.raises(LeaseLost):
        SETTLEMENTS[op](lease_a)
    assert row(raw, task.id) == snapshot


def test_settling_twice_is_lease_lost(a, raw) -> None:
    (task,) = push(a, "true")
    (lease,) = a.receive(1, LOCK)
    lease.complete()
    snapshot = row(raw, task.id)
    with pytest.raises(LeaseLost):
        lease.dead_letter("late", "")
    with pytest.raises(LeaseLost):
        lease.renew(5.0)
    assert row(raw, task.id) == snapshot


# --------------------------------------------------------------------------- release
def test_release_without_counting_gives_the_attempt_back(a, raw) -> None:
    (task,) = push(a, "true")
    (lease,) = a.receive(1, LOCK)
    lease.release(True)
    (lease,) = a.receive(1, LOCK)
    assert lease.attempt == 2
    lease.release(False)  # preempted: this attempt does not count
    r = row(raw, task.id)
    assert r["status"] == "pending"
    assert r["attempt"] == 1
    assert r["preemptions"] == 1
    assert r["locked_by"] is None
    (lease,) = a.receive(1, LOCK)
    assert lease.attempt == 2
    lease.release(False)
    assert row(raw, task.id)["preemptions"] == 2


def test_release_on_first_attempt_without_counting(a, raw) -> None:
    (task,) = push(a, "true")
    (lease,) = a.receive(1, LOCK)
    lease.release(False)
    assert row(raw, task.id)["attempt"] == 0
    (lease,) = a.receive(1, LOCK)
    assert lease.attempt == 1


def test_release_with_delay_hides_the_job(a, raw) -> None:
    (task,) = push(a, "true")
    (lease,) = a.receive(1, LOCK)
    before = time.time()
    lease.release(True, delay=60.0)
    assert a.receive(5, LOCK) == []
    r = row(raw, task.id)
    assert r["status"] == "pending"
    assert r["visible_at"] >= before + 60.0
    raw.execute("UPDATE jobs SET visible_at=? WHERE id=?", (time.time() - 1, task.id))
    (lease,) = a.receive(5, LOCK)
    assert lease.attempt == 2


# --------------------------------------------------------------------------- failed
def _fail(backend: SqliteBackend, *cmds: str) -> list[Task]:
    tasks = push(backend, *cmds)
    for lease in backend.receive(len(cmds), LOCK):
        lease.dead_letter("failed", "")
    return tasks


def test_requeue_all(a, raw) -> None:
    tasks = _fail(a, "x", "y")
    assert a.requeue(None) == 2
    assert a.failed() == []
    for t in tasks:
        r = row(raw, t.id)
        assert (r["status"], r["attempt"], r["reason"]) == ("pending", 0, None)
    leases = a.receive(5, LOCK)
    assert [le.attempt for le in leases] == [1, 1]


def test_clear_pending_and_failed(a, raw) -> None:
    (f,) = _fail(a, "failed one")
    p1, p2 = push(a, "p1", "p2")
    (running,) = push(a, "running")
    # p1 and p2 are first in line; take all three pending so that one stays running
    leases = a.receive(3, LOCK)
    for le in leases:
        if le.message_id != running.id:
            le.release(True)
    assert a.clear(failed=False) == 2
    assert a.size() == 0
    assert [r.id for r in a.failed()] == [f.id]
    assert row(raw, running.id)["status"] == "running"
    assert a.clear(failed=True) == 1
    assert a.failed() == []
    assert raw.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 1


# --------------------------------------------------------------------------- reaper
def test_reaper_returns_a_stale_job_to_pending(open_backend, a, raw, caplog) -> None:
    stale, fresh = push(a, "stale", "fresh")
    a.receive(2, LOCK)
    expire(raw, stale.id)
    reaper = open_backend("R", stale_lock_age=0.0)
    with caplog.at_level(logging.INFO, logger="jobq.sqlite"):
        assert reaper.reap() == 1
    assert any(rec.levelno == logging.INFO
               and rec.getMessage() == "released stale running jobs count=1"
               for rec in caplog.records), caplog.text
    r = row(raw, stale.id)
    assert (r["status"], r["locked_by"], r["locked_until"]) == ("pending", None, None)
    assert row(raw, fresh.id)["status"] == "running"
    (lease,) = reaper.receive(5, LOCK)
    assert lease.message_id == stale.id
    assert lease.attempt == 2


def test_reaper_respects_stale_lock_age(open_backend, a, raw) -> None:
    (task,) = push(a, "x")
    a.receive(1, LOCK)
    expire(raw, task.id, ago=10.0)
    assert open_backend("R", stale_lock_age=3600.0).reap() == 0
    assert row(raw, task.id)["status"] == "running"
    assert open_backend("R2", stale_lock_age=5.0).reap() == 1


def test_reaper_fails_a_stale_job_past_its_max_attempts(open_backend, a, raw, caplog) -> None:
    (task,) = push(a, "x")
    a.receive(1, LOCK)
    expire(raw, task.id)
    with caplog.at_level(logging.INFO, logger="jobq.sqlite"):
        assert open_backend("R", stale_lock_age=0.0, max_attempts=1).reap() == 1
    assert "released stale running jobs" not in caplog.text
    r = row(raw, task.id)
    assert r["status"] == "failed"
    assert "lease expired" in r["reason"]
    assert "A" in r["reason"]
    (rec,) = a.failed()
    assert rec.id == task.id


def test_reaper_uses_the_tasks_own_max_attempts(open_backend, a, raw) -> None:
    (task,) = push(a, "x", max_attempts=1)
    a.receive(1, LOCK)
    expire(raw, task.id)
    assert open_backend("R", stale_lock_age=0.0, max_attempts=5).reap() == 1
    assert row(raw, task.id)["status"] == "failed"


def test_maintenance_reaps_and_can_be_disabled(open_backend, a, raw) -> None:
    (task,) = push(a, "x")
    a.receive(1, LOCK)
    expire(raw, task.id)
    open_backend("off", stale_lock_age=0.0, reaper_interval=0.0).maintenance()
    assert row(raw, task.id)["status"] == "running"
    open_backend("on", stale_lock_age=0.0, reaper_interval=300.0).maintenance()
    assert row(raw, task.id)["status"] == "pending"


# --------------------------------------------------------------------------- poison, config
def test_poison_body_comes_back_as_a_lease_without_task(a) -> None:
    a.push_raw("this is not json", "poison-1")
    (lease,) = a.receive(1, LOCK)
    assert lease.task is None
    assert lease.format_error
    assert lease.raw_body == "this is not json"
    assert lease.message_id == "poison-1"
    lease.dead_letter(f"poison: {lease.format_error}", "")
    (rec,) = a.failed()
    assert rec.id == "poison-1"
    assert rec.command == ""
    assert rec.body == "this is not json"


def test_body_that_is_not_utf8_text_is_poison_not_a_stalled_queue(a, raw) -> None:
    """A TEXT body with bytes that are not UTF-8 (written by another tool) used to make every
    receive fail ("Could not decode to UTF-8 column 'body'"): the queue stalled for good."""
    raw.execute("INSERT INTO jobs (id, queue, body, status, created_at, updated_at) "
                "VALUES ('bad', 'default', CAST(? AS TEXT), 'pending', 0, 0)", (b"{\xff\xfe",))
    good = push(a, "echo fine")[0]
    bad_lease, good_lease = a.receive(2, LOCK)
    assert bad_lease.task is None and "not JSON" in (bad_lease.format_error or "")
    assert "\ufffd" in bad_lease.raw_body
    assert good_lease.task == good
    bad_lease.dead_letter("poison", bad_lease.raw_body)
    assert [r.id for r in a.failed()] == ["bad"]


def test_not_a_database_is_a_config_error(tmp_path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("this is a text file, not a database\n" * 100)
    with pytest.raises(BackendConfigError):
        SqliteBackend(str(path), "default", "A")


def test_missing_directory_is_a_config_error(tmp_path) -> None:
    with pytest.raises(BackendConfigError):
        SqliteBackend(str(tmp_path / "nope" / "jobs.db"), "default", "A")


def test_journal_mode_is_wal(db, a) -> None:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def _rollback_file_with_a_writer(path: str) -> sqlite3.Connection:
    """A database still in rollback-journal mode (as sqlite3 or an older tool makes it),
    with another connection holding its write lock."""
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE other (x)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO other VALUES (1)")
    return writer


def test_opening_a_rollback_mode_file_waits_for_its_writer(db, close_at_end) -> None:
    # SQLite refuses the switch to WAL at once (no busy handler) while another connection
    # holds the write lock of a rollback-mode file: four jobq-ctl pushes opening an old
    # database at once failed "database is busy" that way.  Opening waits its turn.
    writer = _rollback_file_with_a_writer(db)
    release = threading.Timer(0.3, writer.execute, ("COMMIT",))
    release.start()
    try:
        b = close_at_end(SqliteBackend(db, "default", "A", busy_timeout=20.0))
    finally:
        release.join()
        writer.close()
    push(b, "true")
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT x FROM other").fetchall() == [(1,)]


def test_opening_a_file_whose_writer_never_lets_go_is_busy(db) -> None:
    writer = _rollback_file_with_a_writer(db)
    try:
        with pytest.raises(BackendError, match="busy"):
            SqliteBackend(db, "default", "A", busy_timeout=0.3)
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_queues_are_separate(db, open_backend) -> None:
    a = open_backend("A")
    other = SqliteBackend(db, "other", "B")
    try:
        push(a, "x")
        assert other.size() == 0
        assert other.receive(5, LOCK) == []
        assert a.size() == 1
    finally:
        other.close()


def test_duplicate_id_is_rejected_and_nothing_is_pushed(a) -> None:
    t = Task(cmd="x", id="same")
    a.push([t])
    with pytest.raises(BackendError):
        a.push([Task(cmd="new"), Task(cmd="y", id="same")])
    assert a.size() == 1


# --------------------------------------------------------------------------- busy database
@pytest.mark.timing  # asserts a 3 s bound
@pytest.mark.timeout(10)
def test_renew_against_an_exclusive_lock_fails_within_its_timeout(db, a, raw) -> None:
    (task,) = push(a, "x")
    (lease,) = a.receive(1, LOCK)
    before = row(raw, task.id)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        start = time.monotonic()
        with pytest.raises(BackendError) as info:
            lease.renew(0.3)
        elapsed = time.monotonic() - start
        assert not isinstance(info.value, LeaseLost)  # busy is transient, not a lost lease
        assert elapsed < 3.0
        assert elapsed >= 0.2  # it did wait (roughly its timeout), it did not fail at once
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert row(raw, task.id) == before
    assert lease.renew(5.0) == LOCK  # and works again once the lock is gone


@pytest.mark.timing  # asserts a 3 s bound
@pytest.mark.timeout(10)
def test_receive_against_an_exclusive_lock_is_a_backend_error(db, open_backend) -> None:
    b = open_backend("B", busy_timeout=0.1)
    push(b, "x")
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        start = time.monotonic()
        with pytest.raises(BackendError):
            b.receive(1, LOCK)
        assert time.monotonic() - start < 3.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert len(b.receive(1, LOCK)) == 1


def test_receive_walks_the_queue_in_order_without_sorting_it(a, raw) -> None:
    """Receive must stop after LIMIT rows: a sort of every pending job made each receive
    O(queue depth).  The plan is SQLite's own answer, whatever the machine's speed."""
    from supervisor.backends.sqlite.backend import RECEIVE_SQL

    push(a, *["true"] * 50)
    plan = raw.execute("EXPLAIN QUERY PLAN " + RECEIVE_SQL,
                       ("w", None, 0, 0, 0, "default", time.time(), 4)).fetchall()
    details = " | ".join(str(row[-1]) for row in plan)
    assert "jobs_by_priority" in details, details
    assert "TEMP B-TREE" not in details, details


def test_an_old_database_gets_the_new_index(db) -> None:
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT "
                       "NULL, queue TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL, "
                       "attempt INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER, preemptions "
                       "INTEGER NOT NULL DEFAULT 0, token INTEGER NOT NULL DEFAULT 0, locked_by "
                       "TEXT, locked_at REAL, locked_until REAL, visible_at REAL NOT NULL "
                       "DEFAULT 0, created_at REAL NOT NULL, updated_at REAL NOT NULL, reason "
                       "TEXT, output_tail TEXT, exit_status INTEGER, UNIQUE (queue, id));"
                       "CREATE INDEX jobs_by_state ON jobs (queue, status, visible_at, seq);")
    conn.close()
    backend = SqliteBackend(db, "default", "w")
    try:
        names = {r[0] for r in sqlite3.connect(db).execute(
            "SELECT name FROM sqlite_master WHERE type='index'")}
        assert "jobs_by_priority" in names and not names & {"jobs_by_state", "jobs_ready"}
        backend.push([Task(cmd="true")])
        [lease] = backend.receive(4, 60)
        assert lease.task is not None and lease.task.cmd == "true"
    finally:
        backend.close()


@pytest.mark.timing  # asserts a 3 s bound
@pytest.mark.timeout(20)
def test_quick_writes_do_not_wait_out_a_busy_database(db, a, raw) -> None:
    """The main loop settles short tasks' leases itself inside ``quick_writes``: a busy
    database must send the settlement back to the lease's thread, not stall the loop for
    the settle timeout (10 s)."""
    (task,) = push(a, "x")
    (lease,) = a.receive(1, LOCK)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        start = time.monotonic()
        with a.quick_writes(), pytest.raises(BackendError) as info:
            lease.complete()
        assert not isinstance(info.value, LeaseLost)
        assert time.monotonic() - start < 3.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert row(raw, task.id)["status"] == "running"
    with a.quick_writes():
        lease.complete()
    assert row(raw, task.id)["status"] == "succeeded"


def test_a_blob_body_is_read_as_text(tmp_path) -> None:
    """A body stored as a BLOB (another tool pushed bytes) is received like text: a valid
    task runs, bytes that are not UTF-8 make a poison message with the usual hint -- never a
    receive that fails for every job behind it."""
    b = SqliteBackend(str(tmp_path / "q.db"), "default", "w")
    try:
        with b._tx() as conn:
            for job_id, body in (("ok", b'{"cmd": "true"}'), ("bad", b"7uy\xffU")):
                conn.execute("INSERT INTO jobs (id, queue, body, status, created_at, "
                             "updated_at) VALUES (?, 'default', ?, 'pending', 0, 0)",
                             (job_id, body))
        leases = {le.message_id: le for le in b.receive(2, 60.0)}
        assert leases["ok"].task is not None and leases["ok"].task.cmd == "true"
        assert leases["bad"].task is None
        assert "not UTF-8" in (leases["bad"].format_error or "")
    finally:
        b.close()


@pytest.mark.timeout(10)
def test_leases_wait_for_a_reaper_pass_that_failed_on_a_locked_database(db, open_backend
                                                                        ) -> None:
    """A batch run must not end "queue empty" while the stale-lock reaper could not hand its
    lost leases back (a locked database): they come back at its next pass, however long ago
    they were lost (found by test_lock_loss_beside_a_flood_kills_before_expiry)."""
    b = open_backend("B", busy_timeout=0.1, stale_lock_age=0.0, reaper_interval=1.0)
    assert not b.leases_coming_back()
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        b.maintenance()  # the reaper's pass fails: busy
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert b.leases_coming_back()
    b._next_reap = 0.0  # its next pass is due
    b.maintenance()
    assert not b.leases_coming_back()


def test_a_failing_reaper_pass_backs_off_from_5s_to_the_interval(open_backend, caplog,
                                                                 monkeypatch) -> None:
    """Each failed pass one line, the next try 5, 10, 20 ... s later, at most the interval
    (core/backoff.py's helper); its leases count as coming back until a pass works.
    Injected clock."""
    caplog.set_level(logging.INFO)
    b = open_backend("B", reaper_interval=30.0)
    b.clock = clock = FakeClock(1000.0)
    calls: list[float] = []

    def reap() -> int:
        calls.append(clock.now)
        if len(calls) <= 5:
            raise BackendError("database is locked")
        return 0

    monkeypatch.setattr(b, "reap", reap)
    coming_back = []
    for t in range(130):
        clock.now = 1000.0 + t
        b.maintenance()
        coming_back.append(b.leases_coming_back())
    assert calls == [1000, 1005, 1015, 1035, 1065, 1095, 1125]
    assert all(coming_back[:95]) and not any(coming_back[95:])
    assert [r.getMessage() for r in caplog.records if r.name == "jobq.sqlite"] == [
        f"stale-lock reaper skipped this round (next try in {pause}s): database is locked"
        for pause in (5, 10, 20, 30, 30)]


def test_leases_the_reaper_handed_back_after_the_last_receive_are_coming_back(
        open_backend, a, raw) -> None:
    """The reaper released a lost lease after the last (empty) receive: a batch run must
    receive once more before it may end "queue empty"."""
    (task,) = push(a, "x")
    a.receive(1, LOCK)
    expire(raw, task.id)
    b = open_backend("B", stale_lock_age=0.0, reaper_interval=1.0)
    assert b.receive(1, LOCK) == [] and not b.leases_coming_back()
    b.maintenance()  # the reaper hands x back
    assert b.leases_coming_back()
    assert len(b.receive(1, LOCK)) == 1
    assert not b.leases_coming_back()


def test_a_dead_letter_naming_bytes_that_are_not_utf8_is_stored(a) -> None:
    """A spawn error names the task's cwd, whose bytes that are not UTF-8 reach the reason as
    lone surrogates; the settle step stores them as their escapes (raw, the write failed on
    every retry and the task stayed running: found by the SQLite fuzz test)."""
    push(a, "true")
    (lease,) = a.receive(1, LOCK)
    DeadLetter("spawn failed: No such file or directory (cwd /x/a\udce9z)", "out\udcff",
               1).apply(lease)
    (rec,) = a.failed()
    assert rec.reason == "spawn failed: No such file or directory (cwd /x/a\\udce9z)"
    assert rec.output_tail == "out\\udcff"
