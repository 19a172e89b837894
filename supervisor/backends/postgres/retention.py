"""Retention of the PostgreSQL queue: succeeded tasks older than ``--retention`` are deleted,
so the jobs table does not grow by a row per task for ever.  Failed tasks (cancelled ones
included) stay until an operator requeues or clears them, as on SQLite (docs/backends.rst,
"Retention").

Rows go in batches of ``PURGE_BATCH``, each one short autocommit statement over rows found
through the index on finished rows' ended_at, ``FOR UPDATE SKIP LOCKED``: two workers purging
at once split the rows instead of waiting on each other, and no writer waits for more than one
batch.  When and for how long a worker purges is the schedule every queue that keeps succeeded
tasks shares (backends/purger.py), at its own cadence: every ``--reaper-interval`` but at
most once per ``PURGE_EVERY`` -- the expired-lease reaper runs every 10 s by default here, a
purge of rows days old needs no such pace (each pass is a statement on the main pool, and
the idle worker's statement count is what a fleet pays per hour).  ``jobq-ctl prune`` purges
everything due at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Callable, Protocol

from ..purger import Purger
from ..purger import purge_all as shared_purge_all

log = logging.getLogger("jobq.postgres")

PURGE_BATCH = 1000  # rows per statement
PURGE_EVERY = 60.0  # s: the least time between two purge passes (a backlog: PURGE_AGAIN)


class Queue(Protocol):
    """What the purge uses of PostgresBackend (which hands itself in: no import of it here)."""

    queue: str
    jobs: str  # the quoted, schema-qualified jobs table
    clock: Callable[[], float]  # monotonic: the schedule
    wall: Callable[[], float]  # wall clock: the age of a row

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> int: ...


def purge_batch(backend: Queue, before: float, batch: int = PURGE_BATCH) -> int:
    """Delete up to ``batch`` of the queue's tasks that succeeded before ``before`` (wall
    clock, epoch s); how many (the caller's thread).  Raises BackendError."""
    return backend._execute(
        f"DELETE FROM {backend.jobs} WHERE id IN (SELECT id FROM {backend.jobs} WHERE "
        "state='succeeded' AND ended_at < to_timestamp(%s) AND queue=%s "
        "ORDER BY ended_at LIMIT %s FOR UPDATE SKIP LOCKED)", (before, backend.queue, batch))


def purge_all(backend: Queue, before: float, batch: int = PURGE_BATCH) -> int:
    """Every task that succeeded before ``before``, batch after batch; how many."""
    return shared_purge_all(purge_batch, backend, before, batch)


def purger(backend: Queue, retention: float, interval: float) -> Purger:
    """The worker's purge schedule (a pass of ``PostgresBackend.maintenance``): every
    ``interval`` (``--reaper-interval``; 0: never), at least ``PURGE_EVERY`` apart."""
    every = max(interval, PURGE_EVERY) if interval else 0.0
    return Purger(backend, retention, every, purge_batch, PURGE_BATCH, log)
