"""Retention of the SQLite queue: succeeded tasks older than ``--retention`` are deleted.

A succeeded task's row is of no use to the queue once it is done (its result record and its
output have their own stores and retention), and a busy queue would otherwise grow by a row
per task for ever.  Failed tasks -- cancelled ones included, they end in the failed state --
are kept until an operator requeues or clears them: they are work that did not get done
(docs/backends.rst, "Retention").

Rows go in batches of ``PURGE_BATCH``, each its own short write transaction, so no other
writer (a worker settling, ``jobq-ctl push``) waits for more than one batch.  The worker purges
on its maintenance pass (``SqliteBackend.maintenance``, the main thread, beside the stale-lock
reaper), at most ``PURGE_BUDGET`` seconds a pass: a backlog (the first run after an upgrade)
goes on ``PURGE_AGAIN`` seconds later instead of holding the main loop.  ``jobq-ctl prune``
purges everything due at once, batch after batch.  The rows are found through ``jobs_done``
(backends/sqlite/db.py), a partial index over succeeded rows only, so a pass with nothing due costs
one
index probe, not a scan of every succeeded row.
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import AbstractContextManager
from typing import Callable, Protocol

from ..base import BackendError
from ..purger import PURGE_AGAIN, Purger
from ..purger import purge_all as shared_purge_all

log = logging.getLogger("jobq.sqlite")

PURGE_BATCH = 500  # rows per write transaction (~5-15 ms on these machines)
__all__ = ["PURGE_AGAIN", "PURGE_BATCH", "PURGE_SQL", "purge_all", "purge_batch", "purger"]

PURGE_SQL = ("DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE queue=? "
             "AND status='succeeded' AND updated_at<? LIMIT ?)")


class Queue(Protocol):
    """What the purge uses of SqliteBackend (which hands itself in: no import of it here)."""

    queue: str
    clock: Callable[[], float]  # monotonic: the schedule
    wall: Callable[[], float]  # wall clock: the age of a row (its updated_at)

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]: ...


def purge_batch(backend: Queue, before: float, batch: int = PURGE_BATCH) -> int:
    """Delete up to ``batch`` of the queue's tasks that succeeded before ``before`` (wall
    clock) in one write transaction; how many (the caller's thread: main, or jobq-ctl's).
    Raises BackendError."""
    try:
        with backend._tx() as conn:
            return conn.execute(PURGE_SQL, (backend.queue, before, batch)).rowcount
    except sqlite3.DatabaseError as exc:
        raise BackendError(f"SQLite purge failed: {exc}") from None


def purge_all(backend: Queue, before: float, batch: int = PURGE_BATCH) -> int:
    """Every task that succeeded before ``before``, batch after batch; how many (jobq-ctl
    prune)."""
    return shared_purge_all(purge_batch, backend, before, batch)


def purger(backend: Queue, retention: float, interval: float) -> Purger:
    """When the worker purges (its main thread, from ``SqliteBackend.maintenance``): the
    schedule every queue that keeps succeeded tasks shares (backends/purger.py)."""
    return Purger(backend, retention, interval, purge_batch, PURGE_BATCH, log)
