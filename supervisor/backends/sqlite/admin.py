"""The SQLite queue's admin queries, beside SqliteBackend (whose module is at its size
limit): the queue-admin capability (``SqliteAdmin``, base.QueueAdmin: the state of given task
ids, taking back given tasks from a dead worker, taking pending tasks off the queue on a
cancel, one task's row, the cancelled count) and the age of the oldest pending task.  The
caller's thread: jobq-ctl's main thread, a dashboard request thread (each with its own
backend).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ...core.task import MAX_ID, MAX_PRIORITY, prefix_end
from ..base import QueueAdmin, TakenBack, TaskDetail
from ..task_list import TaskQuery, TaskRow
from . import task_list
from .owner import DYING, DeadOwnerPass, owner_state

# How long requeue/cancel wait for a dead worker's lifeline to finish killing its tasks
# (lifeline.KILL_BUDGET: it gives up after 10 s); it takes well under a second.
TAKE_BACK_WAIT = 12.0

_CHUNK = 500  # ids per statement, well below SQLite's 32,766 host parameters


class Queue(Protocol):
    """What the admin queries use of SqliteBackend (which hands itself in: no import of it
    here)."""

    queue: str
    dead_owners: DeadOwnerPass
    owners_known: bool
    priorities_known: bool
    taken_back_at_open: list[TakenBack]
    _conn: sqlite3.Connection

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...
    def _tx(self) -> AbstractContextManager[sqlite3.Connection]: ...


def _chunks(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[i:i + _CHUNK] for i in range(0, len(ids), _CHUNK)]


def task_states(backend: Queue, ids: Sequence[str]) -> dict[str, str]:
    """id -> status (pending, running, succeeded, failed) of those ids that are in the queue."""
    found: dict[str, str] = {}
    for part in _chunks(ids):
        for task_id, status in backend._query(
                f"SELECT id, status FROM jobs WHERE queue=? AND id IN "
                f"({','.join('?' * len(part))})", (backend.queue, *part)):
            found[task_id] = status
    return found


def _dying(backend: Queue, ids: Sequence[str]) -> bool:
    """One of ``ids`` runs for a worker that is gone while its lifeline is still at work."""
    here = backend.dead_owners.here
    if here is None or not backend.owners_known:
        return False
    for part in _chunks(ids):
        for (owner,) in backend._query(
                f"SELECT owner FROM jobs WHERE queue=? AND status='running' AND owner IS NOT "
                f"NULL AND id IN ({','.join('?' * len(part))})", (backend.queue, *part)):
            if owner_state(owner, here) == DYING:
                return True
    return False


def take_back(backend: Queue, ids: Sequence[str],
              wait: float = TAKE_BACK_WAIT) -> dict[str, TakenBack]:
    """Those of ``ids`` that this jobq-ctl took back from a worker that is gone (when it
    opened the database, or now), id -> where each went.  While one of them still belongs
    to a dead worker whose lifeline is killing its tasks, it waits for that (``wait`` at
    most).  Raises BackendError."""
    wanted = set(ids)
    taken = {t.id: t for t in backend.taken_back_at_open if t.id in wanted}
    deadline = time.monotonic() + wait
    while True:
        taken.update((t.id, t) for t in backend.dead_owners.run(backend._conn, backend._tx)
                     if t.id in wanted)
        left = deadline - time.monotonic()
        if left <= 0 or not _dying(backend, ids):
            return taken
        time.sleep(min(0.1, left))  # a one-shot command, bounded by ``wait``


def cancel_pending(backend: Queue, ids: Sequence[str], reason: str,
                   now: float) -> set[str]:
    """Mark those of ``ids`` that are still pending as failed with ``reason`` (which starts
    with "cancelled"), in one transaction per chunk; the ids it took.  A task a worker
    claimed meanwhile is not touched: its worker sees the cancel record at claim time.
    ``requeue`` brings a cancelled task back like any failed one."""
    taken: set[str] = set()
    for part in _chunks(ids):
        with backend._tx() as conn:
            rows = conn.execute(
                f"UPDATE jobs SET status='failed', reason=?, updated_at=?, locked_by=NULL, "
                f"locked_at=NULL, locked_until=NULL WHERE queue=? AND status='pending' AND id "
                f"IN ({','.join('?' * len(part))}) RETURNING id",
                (reason, now, backend.queue, *part)).fetchall()
        taken.update(task_id for (task_id,) in rows)
    return taken


# The first visible pending job of each priority (a few steps each down jobs_by_priority,
# which is in (priority, seq) order), then the earliest of those ten: an ORDER BY seq over
# every priority would sort every pending job.
OLDEST_SQL = (
    "SELECT MIN((SELECT created_at FROM jobs WHERE queue=?1 AND status='pending' "
    "AND priority=p.column1 AND visible_at<=?2 ORDER BY seq LIMIT 1)) "
    f"FROM (VALUES {','.join(f'({i})' for i in range(MAX_PRIORITY + 1))}) AS p")
# A database no writer has opened since priorities came (read-only jobq-ctl): seq order.
OLDEST_SQL_UNMIGRATED = ("SELECT MIN(created_at) FROM (SELECT created_at FROM jobs WHERE "
                         "queue=?1 AND status='pending' AND visible_at<=?2 ORDER BY seq LIMIT 1)")


def oldest_pending_age(backend: Queue, now: float) -> float | None:
    """Seconds since the oldest pending task that a worker could take now was queued (the
    earliest of each priority's first visible one, stepping over those not visible yet), or
    None when none is.  A task pushed with a delay counts as queued at its time (push sets
    its created_at so), not when it was pushed: the autoscaling gauge must not read a task
    delayed a day as a day of backlog.  Like Storage Queue's, a task backing off before a
    retry is not waiting for a worker and is not counted."""
    sql = OLDEST_SQL if backend.priorities_known else OLDEST_SQL_UNMIGRATED
    rows = backend._query(sql, (backend.queue, now))
    rows = [r for r in rows if r[0] is not None]
    return max(0.0, now - rows[0][0]) if rows else None


CANCELLED_SQL = ("SELECT COUNT(*) FROM jobs WHERE queue=? AND status='failed' AND reason "
                 "LIKE 'cancelled%'")
# A range of the UNIQUE (queue, id) index (SQLite compares TEXT byte by byte); the substr
# test only matters for a prefix with no end (prefix_end).
PREFIX_SQL = ("SELECT id FROM jobs WHERE queue=? AND id>=? AND id<? AND substr(id, 1, ?)=? "
              "ORDER BY id LIMIT ?")
DETAIL_SQL = ("SELECT status, attempt, body, reason, locked_by, locked_until FROM jobs "
              "WHERE queue=? AND id=?")


class SqliteAdmin(QueueAdmin):
    """``SqliteBackend.admin()``: the queries above on that backend (its thread)."""

    def __init__(self, backend: Queue) -> None:
        self.backend = backend

    def task_states(self, ids: Sequence[str]) -> dict[str, str]:
        return task_states(self.backend, ids)

    def take_back(self, ids: Sequence[str]) -> dict[str, TakenBack]:
        return take_back(self.backend, ids)

    def cancel_pending(self, ids: Sequence[str], reason: str, now: float) -> set[str]:
        return cancel_pending(self.backend, ids, reason, now)

    def task_detail(self, task_id: str) -> TaskDetail | None:
        rows = self.backend._query(DETAIL_SQL, (self.backend.queue, task_id))
        if not rows:
            return None
        status, attempt, body, reason, worker, until = rows[0]
        return TaskDetail(status, attempt, body, reason, worker, until)

    def cancelled_count(self) -> int:
        return int(self.backend._query(CANCELLED_SQL, (self.backend.queue,))[0][0])

    def list_tasks(self, query: TaskQuery, now: float) -> list[TaskRow]:
        return task_list.list_tasks(self.backend, query, now)

    def ids_starting(self, prefix: str, limit: int) -> list[str]:
        end = prefix_end(prefix) or "\U0010ffff" * (MAX_ID + 1)
        return [i for (i,) in self.backend._query(
            PREFIX_SQL, (self.backend.queue, prefix, end, len(prefix), prefix, limit))]
