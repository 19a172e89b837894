"""The PostgreSQL queue's admin queries (base.QueueAdmin): the state of given task ids, taking
back given tasks whose lease expired, taking pending tasks off the queue on a cancel, one
task's row, the cancelled count; and the age of the oldest pending task.  The caller's thread
(jobq-ctl's main thread, a dashboard request thread: each with a backend of its own), on the
main pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ...core.task import MAX_ID, MAX_PRIORITY, prefix_end
from ..base import QueueAdmin, TakenBack, TaskDetail
from ..task_list import TaskQuery, TaskRow
from . import task_list


class Queue(Protocol):
    """What the admin queries use of PostgresBackend (which hands itself in)."""

    queue: str
    jobs: str  # the quoted, schema-qualified jobs table

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]: ...


# The first ready pending task of each priority (one step down the pending index, which is in
# (queue, priority DESC, run_at, id) order), then the earliest of those: an ORDER BY run_at
# over every priority would sort every pending task.
OLDEST_SQL = (
    "SELECT EXTRACT(EPOCH FROM min(first.run_at)) FROM generate_series(0, %s) AS p(priority), "
    "LATERAL (SELECT run_at FROM {jobs} WHERE queue=%s AND state='pending' "
    "AND priority=p.priority AND run_at <= now() ORDER BY run_at LIMIT 1) AS first")


def oldest_pending_age(backend: Queue, now: float) -> float | None:
    """Seconds the longest-waiting ready task has waited since it became ready (its
    ``run_at``: pushed, its --delay passed, or its retry back-off ended), or None when none
    is ready.  A task held back is not waiting for a worker and is not counted (the
    autoscaling gauge must not read a task delayed a day as a day of backlog)."""
    rows = backend._query(OLDEST_SQL.format(jobs=backend.jobs), (MAX_PRIORITY, backend.queue))
    if not rows or rows[0][0] is None:
        return None
    return max(0.0, now - float(rows[0][0]))


# Whether the database orders text byte by byte (collation C or POSIX, libc provider): then
# a prefix is a range of the jobs' primary key (an Index Scan, tests/postgres/test_short_ids.py);
# under a linguistic collation such a range may step over ids, and the prefix is tested on
# each of the queue's rows instead (a scan, documented in docs/fleet.rst).
BYTE_ORDER_SQL = ("SELECT datcollate IN ('C', 'POSIX') AND coalesce(to_jsonb(d) ->> "
                  "'datlocprovider', 'c') = 'c' FROM pg_database d WHERE datname = "
                  "current_database()")
PREFIX_SQL = ("SELECT id FROM {jobs} WHERE id >= %s AND id < %s AND starts_with(id, %s) "
              "AND queue = %s ORDER BY id LIMIT %s")
PREFIX_SCAN_SQL = ("SELECT id FROM {jobs} WHERE queue = %s AND starts_with(id, %s) "
                   "ORDER BY id LIMIT %s")


class PostgresAdmin(QueueAdmin):
    """``PostgresBackend.admin()``: the queries above on that backend (its thread)."""

    def __init__(self, backend: Queue) -> None:
        self.backend = backend

    def task_states(self, ids: Sequence[str]) -> dict[str, str]:
        b = self.backend
        return dict(b._query(f"SELECT id, state FROM {b.jobs} WHERE queue=%s AND id = ANY(%s)",
                             (b.queue, list(ids))))

    def take_back(self, ids: Sequence[str]) -> dict[str, TakenBack]:
        """Those of ``ids`` whose lease expired (its worker stopped renewing: gone), put back
        to pending now; the next receive counts the attempt, and the worker that gets one past
        its attempts fails it without a run.  A task whose lease is alive is left alone."""
        b = self.backend
        rows = b._query(
            f"UPDATE {b.jobs} SET state='pending', owner=NULL, locked_until=NULL, "
            "run_at=now() WHERE queue=%s AND id = ANY(%s) AND state='running' AND "
            "locked_until < now() RETURNING id, worker", (b.queue, list(ids)))
        return {i: TakenBack(i, worker, "pending") for i, worker in rows}

    def cancel_pending(self, ids: Sequence[str], reason: str, now: float) -> set[str]:
        """Fail those of ``ids`` still pending with ``reason``, in one statement; the ids it
        took.  A task a worker claimed meanwhile is untouched (its row is locked or running)."""
        b = self.backend
        rows = b._query(
            f"UPDATE {b.jobs} SET state='failed', reason=%s, ended_at=to_timestamp(%s), "
            "owner=NULL, locked_until=NULL WHERE queue=%s AND state='pending' AND "
            "id = ANY(%s) RETURNING id", (reason, now, b.queue, list(ids)))
        return {i for (i,) in rows}

    def task_detail(self, task_id: str) -> TaskDetail | None:
        b = self.backend
        rows = b._query(f"SELECT state, attempt, body, reason, worker, EXTRACT(EPOCH FROM "
                        f"locked_until) FROM {b.jobs} WHERE queue=%s AND id=%s",
                        (b.queue, task_id))
        if not rows:
            return None
        state, attempt, body, reason, worker, until = rows[0]
        return TaskDetail(state, attempt, body, reason, worker,
                          None if until is None else float(until))

    def ids_starting(self, prefix: str, limit: int) -> list[str]:
        b = self.backend
        if b._query(BYTE_ORDER_SQL)[0][0]:
            end = prefix_end(prefix) or "\U0010ffff" * (MAX_ID + 1)
            rows = b._query(PREFIX_SQL.format(jobs=b.jobs), (prefix, end, prefix, b.queue, limit))
        else:
            rows = b._query(PREFIX_SCAN_SQL.format(jobs=b.jobs), (b.queue, prefix, limit))
        return [i for (i,) in rows]

    def cancelled_count(self) -> int:
        b = self.backend
        return int(b._query(f"SELECT count(*) FROM {b.jobs} WHERE queue=%s AND "
                            "state='failed' AND reason LIKE 'cancelled%%'", (b.queue,))[0][0])

    def list_tasks(self, query: TaskQuery, now: float) -> list[TaskRow]:
        return task_list.list_tasks(self.backend, query)  # the database's clock says pending
