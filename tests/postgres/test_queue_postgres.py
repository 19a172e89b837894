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


def test_a_poison_body_is_a_lease_without_a_task(pg_url: str, close_at_end) -> None:
    backend = close_at_end(open_queue(pg_url, "jobs", "w1"))
    backend.push_raw("not json at all", "poison-1")
    (lease,) = backend.receive(5, 30.0)
    assert lease.task is None and lease.format_error and "not JSON" in lease.format_error
    assert (lease.message_id, lease.raw_body, lease.attempt) == ("poison-1", "not json at all", 1)
    lease.dead_letter(f"bad message: {lease.format_error}", lease.raw_body)
    (record,) = backend.failed()
    assert (record.id, record.command, record.body) == ("poison-1", "", "not json at all")


def test_retention_purges_old_succeeded_tasks_only(pg_url: str, close_at_end) -> None:
    """The worker's maintenance pass deletes the tasks that succeeded more than --retention
    ago, in batches; failed and recent ones stay; jobq-ctl prune does the same at once."""
    from tests.fakes.clock import FakeClock

    backend = close_at_end(open_queue(pg_url, "jobs", "w1", retention=7 * 86400.0))
    backend.clock = FakeClock(1000.0)
    tasks = [Task(cmd=f"echo {i}") for i in range(5)]
    backend.push(tasks)
    leases = {le.message_id: le for le in backend.receive(5, 30.0)}
    for task in tasks[:4]:
        leases[task.id].complete()
    leases[tasks[4].id].dead_letter("failed", "")
    with psycopg.connect(pg_url, autocommit=True) as conn:  # three of them, and the failed
        conn.execute("UPDATE jobq.jobs SET ended_at = now() - interval '8 days' "
                     "WHERE id = ANY(%s)", ([t.id for t in tasks[:3]] + [tasks[4].id],))
    backend.maintenance()
    left = backend.admin().task_states([t.id for t in tasks])
    assert left == {tasks[3].id: "succeeded", tasks[4].id: "failed"}
    backend.maintenance()  # not due again before --reaper-interval
    assert backend.prune_succeeded(backend.wall() + 1) == 1
    assert backend.admin().task_states([t.id for t in tasks]) == {tasks[4].id: "failed"}


def test_the_purge_keeps_its_own_cadence_not_the_reapers(pg_url: str, close_at_end) -> None:
    """The expired-lease reaper runs every 10 s on PostgreSQL; the purge at most once a
    minute (retention.PURGE_EVERY), on the injected schedule clock."""
    from supervisor.backends.postgres.retention import PURGE_EVERY
    from tests.fakes.clock import FakeClock

    backend = close_at_end(open_queue(pg_url, "jobs", "w1", retention=7 * 86400.0))
    assert backend.reaper is not None and backend.reaper.interval == 10.0  # the default
    backend.clock = FakeClock(1000.0)

    def old_succeeded() -> str:
        task = Task(cmd="true")
        backend.push([task])
        (lease,) = backend.receive(1, 30.0)
        lease.complete()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE jobq.jobs SET ended_at = now() - interval '8 days' "
                         "WHERE id=%s", (task.id,))
        return task.id

    first = old_succeeded()
    backend.maintenance()  # the first pass purges
    assert backend.admin().task_states([first]) == {}
    second = old_succeeded()
    for _ in range(int(PURGE_EVERY // 10) - 1):  # the reaper's cadence: no purge yet
        backend.clock.advance(10.0)
        backend.maintenance()
        assert backend.admin().task_states([second]) == {second: "succeeded"}
    backend.clock.advance(PURGE_EVERY - (PURGE_EVERY // 10 - 1) * 10.0)
    backend.maintenance()
    assert backend.admin().task_states([second]) == {}


def test_a_lease_given_back_without_delay_keeps_its_place(pg_url: str, close_at_end) -> None:
    """Received ahead and given back (or preempted): it is still before the tasks pushed after
    it, as on SQLite; a retry's delay puts it behind them."""
    queue = close_at_end(open_queue(pg_url, "jobs", "w1"))
    first, second, third = Task(cmd="echo 1"), Task(cmd="echo 2"), Task(cmd="echo 3")
    queue.push([first, second, third])
    (lease,) = queue.receive(1, 30.0)
    assert lease.message_id == first.id
    lease.release(False)
    (again,) = queue.receive(1, 30.0)
    assert again.message_id == first.id
    again.release(True, 0.0)
    leases = queue.receive(3, 30.0)
    assert [le.message_id for le in leases] == [first.id, second.id, third.id]
    leases[0].release(True, 0.2)
    assert [le.message_id for le in queue.receive(3, 30.0)] == []
    wait_for(lambda: [le.message_id for le in queue.receive(1, 30.0)] == [first.id], 10,
             what="the delayed retry")


def test_a_stale_lease_in_a_batch_completes_nothing_and_its_neighbours_complete(
        pg_url: str, close_at_end) -> None:
    """complete_many (one fenced UPDATE for a turn's succeeded tasks): in one batch, a lease
    taken back and handed to another worker, and one taken back and handed to this worker
    again (same owner, a later attempt), are each told LeaseLost and their rows stay
    byte-identical; the fresh leases beside them are completed as ``complete`` would."""
    mine = close_at_end(open_queue(pg_url, "jobs", "w1"))
    theirs = close_at_end(open_queue(pg_url, "jobs", "w2"))
    assert mine.batch_complete
    tasks = [Task(cmd="true") for _ in range(4)]
    mine.push(tasks)
    leases = mine.receive(4, 30.0)
    assert [le.message_id for le in leases] == [t.id for t in tasks]
    a, b, c, d = leases
    for stale in (b, c):
        expire(pg_url, stale.message_id)
        assert list(mine.admin().take_back([stale.message_id])) == [stale.message_id]
    (other,) = theirs.receive(1, 30.0)  # b, the first in line, to the other worker
    (again,) = mine.receive(1, 30.0)  # c to this worker again: attempt 2
    assert (other.message_id, again.message_id, again.attempt) == (b.message_id,
                                                                   c.message_id, 2)
    before = {t.id: row(pg_url, t.id) for t in (tasks[1], tasks[2])}
    errors = mine.complete_many([a, b, c, d])
    assert [type(e) for e in errors] == [type(None), LeaseLost, LeaseLost, type(None)]
    assert {t.id: row(pg_url, t.id) for t in (tasks[1], tasks[2])} == before
    for done in (a, d):
        state, owner, attempt, until, worker, reason, _, status, _, ended = row(
            pg_url, done.message_id)
        assert (state, owner, attempt, until, worker, reason, status) == (
            "succeeded", None, 1, None, "w1", None, 0)
        assert ended is not None
    # the holders' leases are whole: each completes (again: in a batch of its own)
    assert theirs.complete_many([other]) == [None] and mine.complete_many([again]) == [None]
    assert [row(pg_url, t.id)[:3] for t in tasks] == [("succeeded", None, 1),
                                                      ("succeeded", None, 2),
                                                      ("succeeded", None, 2),
                                                      ("succeeded", None, 1)]
