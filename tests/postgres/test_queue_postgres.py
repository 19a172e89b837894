"""The PostgreSQL queue on a real server: the fencing of leases (acceptance 3), what a renewal
costs the table (a HOT update), and the queue through the real commands (test_queue_e2e.py)."""

from __future__ import annotations

import copy

import psycopg
import pytest

from supervisor.backends.base import LeaseLost
from supervisor.core.task import Task
from tests.conftest import wait_for
from tests.postgres.queue import open_queue

pytestmark = pytest.mark.timeout(120)

ROW = ("SELECT state, owner, attempt, locked_until, worker, reason, output_tail, exit_status, "
       "run_at, ended_at FROM jobq.jobs WHERE id=%s")


def row(url: str, task_id: str) -> tuple:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(ROW, (task_id,)).fetchone()
        assert found is not None
        return found


def expire(url: str, task_id: str) -> None:
    """The lease's lock passed (its worker stopped renewing, or froze)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE jobq.jobs SET locked_until = now() - interval '1 second' "
                     "WHERE id=%s", (task_id,))


def test_a_worker_whose_lease_was_taken_back_cannot_write(pg_url: str, close_at_end) -> None:
    """Acceptance 3: the lease lapsed, was taken back and handed out again -- to another
    worker, then to the same worker again (same owner, a later attempt).  The stale lease's
    renew, complete, release (both kinds) and dead_letter each reach the database, change
    nothing and raise LeaseLost; the holder's lease is whole."""
    mine = close_at_end(open_queue(pg_url, "jobs", "w1"))
    theirs = close_at_end(open_queue(pg_url, "jobs", "w2"))
    task = Task(cmd="true")
    mine.push([task])
    (stale,) = mine.receive(1, 30.0)
    assert stale.renew(5.0) == pytest.approx(30.0, abs=1.0)

    def taken_back() -> None:
        expire(pg_url, task.id)
        assert list(mine.admin().take_back([task.id])) == [task.id]

    taken_back()
    (other,) = theirs.receive(1, 30.0)
    assert (other.attempt, row(pg_url, task.id)[:3]) == (2, ("running", theirs.owner, 2))
    writes = {"renew": lambda le: le.renew(5.0), "complete": lambda le: le.complete(),
              "retry": lambda le: le.release(True, 10.0),
              "preempt": lambda le: le.release(False),
              "fail": lambda le: le.dead_letter("late", "output", 1)}
    for name, write in writes.items():
        before = row(pg_url, task.id)
        with pytest.raises(LeaseLost):
            write(copy.copy(stale))  # a fresh copy: every call goes to the database
        assert row(pg_url, task.id) == before, name
    assert other.renew(5.0) == pytest.approx(30.0, abs=1.0)

    # Back to the first worker: its owner again, but the attempt moved on.
    other_copy = copy.copy(other)
    taken_back()
    (again,) = mine.receive(1, 30.0)
    assert again.attempt == 3 and row(pg_url, task.id)[1] == mine.owner
    for lease in (stale, other_copy):
        for name, write in writes.items():
            before = row(pg_url, task.id)
            with pytest.raises(LeaseLost):
                write(copy.copy(lease))
            assert row(pg_url, task.id) == before, name
    again.dead_letter("exit status 1", "tail", 1)
    state, owner, attempt, until, worker, reason, tail, status, _, ended = row(pg_url, task.id)
    assert (state, owner, attempt, until, worker, reason, tail, status) == (
        "failed", None, 3, None, "w1", "exit status 1", "tail", 1)
    assert ended is not None


def test_the_owner_is_unique_per_process_start(pg_url: str, close_at_end) -> None:
    """A user-set worker id is shown as is, but the fencing owner carries this process
    start's nonce: a restarted worker with the same --worker-id is another owner."""
    from supervisor.backends.postgres.backend import START_NONCE

    backend = close_at_end(open_queue(pg_url, "jobs", "fixed-name"))
    backend.push([Task(cmd="true")])
    (lease,) = backend.receive(1, 30.0)
    assert backend.owner == f"fixed-name#{START_NONCE}" and len(START_NONCE) >= 12
    assert backend.status().running[0]["worker"] == "fixed-name"
    lease.complete()


def test_a_renewal_is_a_hot_update(pg_url: str, close_at_end) -> None:
    """Every heartbeat changes only locked_until, which no index covers: PostgreSQL updates
    the row in place on its page (HOT), writing no index entry."""
    backend = close_at_end(open_queue(pg_url, "jobs", "w1"))
    backend.push([Task(cmd="true") for _ in range(5)])
    leases = backend.receive(5, 60.0)
    assert len(leases) == 5

    def hot() -> tuple[int, int]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            found = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                                 "WHERE schemaname='jobq' AND relname='jobs'").fetchone()
            assert found is not None
            return found

    # the counters are flushed by each session within a second or so of its transaction
    before = wait_for(lambda: hot() if hot()[0] >= 5 else None, 30, what="the receive counted")
    renewals = 40
    for i in range(renewals):
        leases[i % 5].renew(5.0)
    after = wait_for(lambda: hot() if hot()[0] - before[0] >= renewals else None, 30,
                     what="the renewals counted")
    assert after[0] - before[0] == renewals
    assert after[1] - before[1] == renewals, (before, after)
    for lease in leases:
        lease.complete()
