"""Retention of the SQLite queue (issue 25, class 7): succeeded tasks older than --retention
are purged in short batches from the maintenance pass; failed, cancelled, pending and running
tasks stay.  Real files in tmp_path; the age and the schedule come from injected clocks."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.backends.sqlite.retention import PURGE_AGAIN, PURGE_SQL
from supervisor.core.task import Task
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(60)

DAY = 86_400.0
LOCK = 60.0
INTERVAL = 300.0


@pytest.fixture
def make(db, close_at_end) -> Callable[..., SqliteBackend]:
    """A backend on the file whose clocks are injected: ``.clock`` (the schedule, monotonic)
    and ``.wall`` (the age of a row), both at the real time it was made."""

    def build(queue: str = "default", **kwargs) -> SqliteBackend:
        kwargs.setdefault("reaper_interval", INTERVAL)
        backend = close_at_end(SqliteBackend(db, queue, "w", **kwargs))
        backend.clock = FakeClock(1000.0)
        backend.wall = FakeClock(time.time())
        return backend

    return build


def run(backend: SqliteBackend, *cmds: str, fail: str = "") -> list[str]:
    """Push ``cmds`` and settle each: succeeded (or failed with the reason ``fail``); their
    ids."""
    tasks = [Task(cmd=c) for c in cmds]
    backend.push(tasks)
    for lease in backend.receive(len(tasks), LOCK):
        if fail:
            lease.dead_letter(fail, "")
        else:
            lease.complete()
    return [t.id for t in tasks]


def states(db: str) -> dict[str, str]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT id, status FROM jobs"))
    finally:
        conn.close()


def test_succeeded_tasks_go_after_the_retention_the_rest_stays(make, db, caplog) -> None:
    b = make()
    old = run(b, "true", "true")
    failed = run(b, "false", fail="exit status 1; attempt 5 of 5, giving up")
    # a cancelled task ends in the failed state (settlement.py)
    cancelled = run(b, "sleep 1", fail="cancelled by ops at 2026-11-26T12:00:00Z: no")
    (running,) = run(b, "sleep 2")[:1]
    b._conn.execute("UPDATE jobs SET status='running' WHERE id=?", (running,))
    b.wall.now += 6 * DAY  # younger than 7 days: kept
    b.maintenance()
    assert set(states(db)) == {*old, *failed, *cancelled, running}
    young = run(b, "true")
    pending = b.push([Task(cmd="echo later")])
    # it succeeded now on the injected clock (the lease writes the real time)
    b._conn.execute("UPDATE jobs SET updated_at=? WHERE id=?", (b.wall(), young[0]))
    b.wall.now += 1.5 * DAY  # the old ones are 7.5 days old, the young one 1.5 days
    b.clock.now += INTERVAL  # the next maintenance pass
    with caplog.at_level(logging.INFO, logger="jobq.sqlite"):
        b.maintenance()
    left = states(db)
    assert not set(old) & set(left)
    assert set(left) == {*young, *failed, *cancelled, running, *pending}
    assert "purged 2 succeeded task(s) older than 7d" in caplog.text


def test_only_the_backends_queue_is_purged(make, db) -> None:
    other = make("other", retention=1 * DAY)
    mine = make(retention=1 * DAY)
    theirs = run(other, "true")
    ours = run(mine, "true")
    mine.wall.now += 2 * DAY
    mine.maintenance()
    assert set(states(db)) == set(theirs)
    del ours


def test_purge_runs_once_per_reaper_interval_and_never_when_disabled(make, db) -> None:
    b = make(retention=1 * DAY)
    b.maintenance()  # the first pass: nothing due yet
    ids = run(b, "true")
    b.wall.now += 2 * DAY
    b.clock.now += INTERVAL - 1
    b.maintenance()
    assert set(states(db)) == set(ids), "purged before the interval"
    b.clock.now += 1
    b.maintenance()
    assert states(db) == {}
    for kwargs in ({"retention": 0.0}, {"reaper_interval": 0.0}):
        off = make(**kwargs)
        kept = run(off, "true")
        off.wall.now += 365 * DAY
        off.maintenance()
        assert set(kept) <= set(states(db)), kwargs


def deletes(statements: list[str]) -> int:
    """How many purge batches the traced statements hold (each its own transaction)."""
    purges = [i for i, s in enumerate(statements) if s.startswith("DELETE FROM jobs WHERE seq")]
    for i in purges:
        assert statements[i - 1] == "BEGIN IMMEDIATE" and statements[i + 1] == "COMMIT"
    return len(purges)


def test_a_backlog_goes_in_short_batches_across_passes(make, db) -> None:
    """1,200 rows due, batches of 500 and no time budget left after the first: one batch per
    pass, one write transaction each, the next pass PURGE_AGAIN later (not an interval)."""
    b = make(retention=1 * DAY)
    b.purger.batch, b.purger.budget = 500, 0.0
    ids = run(b, *["true"] * 1200)
    b.wall.now += 2 * DAY
    statements: list[str] = []
    b._conn.set_trace_callback(statements.append)
    b.maintenance()
    assert len(states(db)) == 700
    assert deletes(statements) == 1
    b.clock.now += PURGE_AGAIN - 0.01
    b.maintenance()
    assert len(states(db)) == 700, "the next batch came before PURGE_AGAIN"
    b.clock.now += 0.01
    b.maintenance()
    assert len(states(db)) == 200
    b.clock.now += PURGE_AGAIN
    b.maintenance()  # the last 200: fewer than a batch, so the next pass is an interval away
    assert states(db) == {}
    assert deletes(statements) == 3
    assert b.purger.next_at == b.clock.now + INTERVAL
    del ids


def test_one_pass_takes_several_batches_within_its_budget(make, db) -> None:
    b = make(retention=1 * DAY)
    b.purger.batch = 100  # the injected clock stands still: the budget never runs out
    run(b, *["true"] * 250)
    b.wall.now += 2 * DAY
    b.maintenance()
    assert states(db) == {}


def test_prune_deletes_everything_due_batch_after_batch(make, db) -> None:
    b = make()
    old = run(b, *["true"] * 1100)
    failed = run(b, "false", fail="exit status 1")
    cutoff = time.time() + 1
    young = run(b, "true")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE jobs SET updated_at=updated_at+10 WHERE id=?", (young[0],))
    conn.close()
    assert b.prune_succeeded(cutoff) == len(old)
    assert set(states(db)) == {*failed, *young}


def test_a_pass_with_nothing_due_reads_the_index_not_every_row(make, db) -> None:
    b = make()
    plan = b._conn.execute("EXPLAIN QUERY PLAN " + PURGE_SQL.split("IN (", 1)[1][:-1],
                           ("default", 0.0, 500)).fetchall()
    assert "jobs_done" in str(plan), plan


def test_a_busy_database_skips_the_round_with_a_warning(make, db, caplog) -> None:
    b = make(retention=1 * DAY, busy_timeout=0.05)
    run(b, "true")
    b.wall.now += 2 * DAY
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with caplog.at_level(logging.WARNING, logger="jobq.sqlite"):
            b.purger.maintenance()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "purge of succeeded tasks skipped this round" in caplog.text
    assert b.purger.next_at == b.clock.now + INTERVAL
    b.clock.now += INTERVAL
    b.purger.maintenance()
    assert states(db) == {}
