"""Rescue of expired leases on the PostgreSQL queue: a running task whose ``locked_until`` (the
database clock) passed more than ``--stale-lock-age`` ago -- its worker died, froze or lost
the server -- goes back to pending, or to failed on its last attempt (docs/backends.rst,
"PostgreSQL").

Every live worker tries every ``--reaper-interval`` (defaults for this backend: 10 s and 0,
so a lease comes back within ~10 s of its lock's end) from the backend's ``maintenance`` on
the main thread; one worker of a queue at a time does the work, under
``pg_try_advisory_xact_lock`` -- the others find the lock taken and go on at once.  Its first
statement takes that lock and the expired rows ``FOR UPDATE SKIP LOCKED`` (a row a settlement
is writing just now is left for the next pass); when there are none, which is nearly always,
that statement is the whole pass: a worker's housekeeping never holds up its receive for more
than one short statement.  Only when rows expired does a second one move them, each still
fenced by its (id, owner, attempt), so two reapers at once can never take one lease twice,
and a stale worker that wakes up afterwards matches no row (LeaseLost).

The attempt the dead run took was counted at its receive, so the next receive makes it the
next attempt; a task that used its last one (its own ``max_attempts``, else the worker's
``--max-attempts``) is failed with ``lease expired on the last attempt (worker W stopped
renewing)``, as on SQLite.

Not done in the receive itself: that statement would have to visit every running row of the
queue on every receive (the index on running rows has no ``locked_until``, and must not, for
HOT heartbeats), on the hot path of every worker.  Measured on the 2-core VM with 20,000
pending rows: a one-row receive took 0.09 ms with 1,000 or 5,000 running rows beside it, and
0.42 / 2.31 ms with the rescue folded into it as a CTE; this pass costs 0.49 / 2.43 ms, but
once every ``--reaper-interval`` instead of at every receive.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ...core.backoff import Outage
from ...core.settings import Settings
from ...core.task import Task, TaskFormatError
from ..base import BackendError, TakenBack
from .connect import Conn
from .schema import Tables

log = logging.getLogger("jobq.postgres")

REAP_BATCH = 500  # rows per pass: a mass expiry (a server outage) goes on at the next pass
REAP_RETRY_MIN = 5.0  # s: a pass that failed is tried again this soon at first
REAPER_SKIPPED = ("expired-lease reaper skipped this round (next try in %(backoff).0fs): "
                  "%(error)s")
EXPIRED_REASON = "lease expired on the last attempt (worker {worker} stopped renewing)"


class Database(Protocol):
    """What the reaper uses of the backend's database (db.py)."""

    schema: str
    tables: Tables
    wake_channel: str

    def main(self, what: str) -> contextlib.AbstractContextManager[Conn]:
        """A connection of the main pool; psycopg's errors in the block -> BackendError."""
        ...


def last_attempt(body: str, attempt: int, max_attempts: int) -> bool:
    """Whether ``attempt`` was the task's last: its own max_attempts, else ``max_attempts``
    (a poison body: the worker's; the next receive fails it anyway)."""
    try:
        own = Task.parse(body).max_attempts
    except TaskFormatError:
        own = None
    return attempt >= (own or max_attempts)


@dataclass
class ExpiredLeaseReaper:
    """The expired-lease pass of one queue (main thread).  ``interval`` 0: never
    (``--reaper-interval 0``)."""

    db: Database
    queue: str
    max_attempts: int
    interval: float
    stale_age: float
    clock: Callable[[], float] = time.monotonic
    batch: int = REAP_BATCH
    taken_back: int = field(default=0, init=False)  # tasks this worker took back (tests, metrics)

    def __post_init__(self) -> None:
        self.jobs = self.db.tables.jobs
        # one lock per queue of the schema, apart from any other advisory lock of ours
        self.lock_name = f"jobq-reaper {self.db.schema} {self.queue}"
        self.next_pass = self.clock()  # the first pass at the first maintenance
        self.outage = Outage("expired-lease reaper", log, self.clock,
                             backoff_min=REAP_RETRY_MIN,
                             backoff_max=max(self.interval, REAP_RETRY_MIN), log_every=0.0,
                             repeat=True, warning=REAPER_SKIPPED, recovery=None)

    def maintenance(self) -> list[TakenBack]:
        """A pass when one is due (its schedule: ``interval``; after a failure, back-off);
        what it took back."""
        now = self.clock()
        if not self.interval or now < self.next_pass:
            return []
        self.next_pass = now + self.interval
        try:
            taken = self.reap()
        except BackendError as exc:
            self.next_pass = now + self.outage.failed("reap", exc)
            return []
        self.outage.succeeded()
        return taken

    def reap(self) -> list[TakenBack]:
        """Take back the queue's expired leases (up to ``batch``), unless another worker's
        reaper holds the queue's lock; what was taken.  Raises BackendError.  Those that go
        back to pending are NOTIFYed in the same transaction (listener.py)."""
        with self.db.main("expired-lease pass") as conn, conn.transaction():
            rows = conn.execute(
                "WITH l AS MATERIALIZED (SELECT pg_try_advisory_xact_lock("
                "hashtextextended(%s, 0)) AS got) "
                f"SELECT id, owner, attempt, worker, body FROM {self.jobs} "
                "WHERE (SELECT got FROM l) AND queue=%s AND state='running' "
                "AND locked_until < now() - make_interval(secs => %s) "
                "ORDER BY locked_until LIMIT %s FOR UPDATE SKIP LOCKED",
                (self.lock_name, self.queue, self.stale_age, self.batch)).fetchall()
            if not rows:
                return []
            taken = self._take(conn, rows)
            if any(t.status == "pending" for t in taken):
                # idle workers (this one too) start them at once, as after a push
                conn.execute("SELECT pg_notify(%s, %s)", (self.db.wake_channel, self.queue))
        self._log(taken)
        self.taken_back += len(taken)
        return taken

    def _take(self, conn: Conn, rows: Sequence[tuple]) -> list[TakenBack]:
        """Inside the pass's transaction: ``rows`` (id, owner, attempt, worker, body) back to
        pending, or failed on their last attempt, each fenced by (id, owner, attempt)."""
        ids, owners, attempts, final = [], [], [], []
        for task_id, owner, attempt, _worker, body in rows:
            ids.append(task_id)
            owners.append(owner)
            attempts.append(attempt)
            final.append(last_attempt(body, attempt, self.max_attempts))
        done = conn.execute(
            f"UPDATE {self.jobs} j SET "
            "state = CASE WHEN t.last THEN 'failed' ELSE 'pending' END, "
            "reason = CASE WHEN t.last THEN replace(%s, '{worker}', COALESCE(j.worker, '?')) "
            "END, "
            "ended_at = CASE WHEN t.last THEN now() END, "
            "worker = CASE WHEN t.last THEN j.worker END, "
            "owner = NULL, locked_until = NULL, output_tail = NULL, exit_status = NULL "
            "FROM unnest(%s::text[], %s::text[], %s::int[], %s::bool[]) "
            "AS t(id, owner, attempt, last) "
            "WHERE j.id = t.id AND j.owner IS NOT DISTINCT FROM t.owner "
            "AND j.attempt = t.attempt AND j.state = 'running' "
            "RETURNING j.id, j.state",
            (EXPIRED_REASON, ids, owners, attempts, final)).fetchall()
        state: dict[str, str] = {task_id: status for task_id, status in done}
        return [TakenBack(task_id, worker, state[task_id])
                for task_id, _owner, _attempt, worker, _body in rows if task_id in state]

    def _log(self, taken: list[TakenBack]) -> None:
        for worker in sorted({t.worker or "?" for t in taken}):
            mine = [f"{t.id} {'failed (last attempt)' if t.status == 'failed' else 'pending'}"
                    for t in taken if (t.worker or "?") == worker]
            log.warning("lease expired: worker %s stopped renewing: took back %d running "
                        "task(s) of queue %s: %s", worker, len(mine), self.queue,
                        ", ".join(mine[:10]) + (" ..." if len(mine) > 10 else ""))



def expired_lease_reaper(settings: Settings, db: Database) -> ExpiredLeaseReaper:
    """A worker's reaper of ``settings.queue`` (``--reaper-interval``, ``--stale-lock-age``,
    ``--max-attempts``) (main thread)."""
    return ExpiredLeaseReaper(db, settings.queue, max_attempts=settings.max_attempts,
                              interval=settings.reaper_every, stale_age=settings.stale_age)
