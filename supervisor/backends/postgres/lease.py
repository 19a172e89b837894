"""The lease of the PostgreSQL backend: one running row, fenced by (id, owner, attempt).

Made on the main thread by PostgresBackend.receive; renewed and settled by its LeaseKeeper
thread on the backend's lease pool (connections no receive or admin query ever waits on), each
statement under a statement timeout shorter than the time the call may take.  Every write is
``UPDATE ... WHERE id=%s AND owner=%s AND attempt=%s AND state='running'``: the owner is unique
per process start and the attempt is counted at each receive, so a worker whose lease was taken
back -- and perhaps handed out again -- matches no row, changes nothing and learns its lease is
gone (LeaseLost).  Lock times come from the database clock (``now()``); the kill deadline is the
worker's own monotonic rule (docs/architecture.rst, "The lease deadline rule").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ...core.task import Task
from ..base import BackendError, LeaseLost
from ..common import parse_body, settled_error

COMPLETED = "state='succeeded', exit_status=0, reason=NULL"
ENDED = "owner=NULL, locked_until=NULL, ended_at=now(), worker=%s"

# A settlement may wait this long for the database (its keeper thread retries a BackendError
# while the lease lasts).
SETTLE_TIMEOUT = 10.0


class Writer(Protocol):
    """What a lease uses of PostgresBackend (which hands itself in: no import of it here)."""

    queue: str
    worker_id: str  # shown as who ran the task
    jobs: str  # the quoted, schema-qualified jobs table

    def lease_write(self, sql: str, args: tuple[Any, ...], timeout: float) -> list[tuple]:
        """One statement on the lease pool, bounded by ``timeout``; its rows."""
        ...

    def batch_write(self, sql: str, args: tuple[Any, ...]) -> list[tuple]:
        """One statement on the main pool (a connection of its own), bounded as the main
        thread's calls are; its rows (the worker's completer thread)."""
        ...


class PostgresLease:
    """A running task held by this worker.  Used from its LeaseKeeper thread only (or the
    main thread before the thread exists)."""

    def __init__(self, backend: Writer, row: tuple, owner: str) -> None:
        """``row``: (id, body, attempt, seconds granted) as the receive returned it."""
        self._backend = backend
        self.queue = backend.queue
        self.message_id, self.raw_body, self.attempt, granted = row[:4]
        self.lock_duration = float(granted)
        self._fence = (self.message_id, owner, self.attempt)
        self._over = False  # settled, or found lost: nothing more is sent
        self.format_error: str | None
        self.task: Task | None
        self.task, self.format_error = parse_body(self.raw_body)

    def _write(self, what: str, assignments: str, args: tuple, timeout: float) -> list[tuple]:
        """One fenced UPDATE.  LeaseLost when it matched no row (the lease was taken back,
        perhaps handed out again, or settled), BackendError on a database that failed or did
        not answer within ``timeout``."""
        if self._over:
            raise settled_error(f"task {self.message_id}: {what}")
        rows = self._backend.lease_write(
            f"UPDATE {self._backend.jobs} SET {assignments} "
            "WHERE id=%s AND owner=%s AND attempt=%s AND state='running' RETURNING "
            "EXTRACT(EPOCH FROM locked_until - now())", args + self._fence, timeout)
        if not rows:
            self._over = True
            raise LeaseLost(f"task {self.message_id}: {what}: lease (attempt {self.attempt}) "
                            f"no longer held by this worker")
        return rows

    def renew(self, timeout: float) -> float:
        """Extend the lock by its length from the database's now; the seconds granted as the
        database computed them (keeper thread).  Only ``locked_until`` changes and no index
        covers it: a HOT update."""
        rows = self._write("renew", "locked_until = now() + make_interval(secs => %s)",
                           (self.lock_duration,), timeout)
        return float(rows[0][0])

    def complete(self) -> None:
        self._end("complete", COMPLETED, ())

    def release(self, count_attempt: bool, delay: float = 0.0) -> None:
        """Back to pending, ready ``delay`` seconds from the database's now; without
        ``count_attempt`` (preemption) the attempt taken at receive is given back.  Without a
        delay it keeps its run_at, so its place in line (run_at orders tasks of one priority,
        as seq does on SQLite): a lease received ahead and given back is not sent behind the
        tasks pushed after it."""
        self._settle("release", "state='pending', owner=NULL, locked_until=NULL, worker=NULL, "
                     "run_at = CASE WHEN %s > 0 THEN now() + make_interval(secs => %s) "
                     "ELSE run_at END, attempt = attempt - %s",
                     (max(0.0, delay), max(0.0, delay), 0 if count_attempt else 1))

    def dead_letter(self, reason: str, output_tail: str, exit_status: int | None = None) -> None:
        self._end("dead-letter", "state='failed', reason=%s, output_tail=%s, exit_status=%s",
                  (reason, output_tail, exit_status))

    def _end(self, what: str, assignments: str, args: tuple) -> None:
        """Succeeded or failed: ended now, by this worker (``worker`` keeps who ran it)."""
        self._settle(what, f"{assignments}, {ENDED}", args + (self._backend.worker_id,))

    def _settle(self, what: str, assignments: str, args: tuple) -> None:
        """The last write of the lease: the row leaves 'running', so the fence can never match
        again; afterwards nothing more is sent."""
        self._write(what, assignments, args, SETTLE_TIMEOUT)
        self._over = True


def complete_all(backend: Writer, leases: Sequence[PostgresLease]) -> list[BaseException | None]:
    """Complete ``leases`` in ONE statement, each row still fenced by its own (id, owner,
    attempt) and ``state='running'``: a row that matched is completed exactly as
    ``complete`` would; a lease whose row matched nothing is told LeaseLost -- just that one,
    its neighbours are completed.  A failed statement completed none: each lease gets the
    BackendError and its keeper thread tries again (the worker's completer thread;
    Backend.complete_many)."""
    errors: list[BaseException | None] = [None] * len(leases)
    todo = []
    for i, lease in enumerate(leases):
        if lease._over:
            errors[i] = settled_error(f"task {lease.message_id}: complete")
        else:
            todo.append(i)
    if not todo:
        return errors
    fences = [leases[i]._fence for i in todo]
    try:
        rows = backend.batch_write(
            f"UPDATE {backend.jobs} j SET {COMPLETED}, {ENDED} FROM unnest(%s::text[], "
            "%s::text[], %s::int[]) AS f(id, owner, attempt) WHERE j.id = f.id AND "
            "j.owner = f.owner AND j.attempt = f.attempt AND j.state='running' "
            "RETURNING j.id, j.attempt",
            (backend.worker_id, [f[0] for f in fences], [f[1] for f in fences],
             [f[2] for f in fences]))
    except BackendError as exc:
        for i in todo:
            errors[i] = exc
        return errors
    done = {(row[0], row[1]) for row in rows}
    for i in todo:
        lease = leases[i]
        lease._over = True  # completed, or found lost: nothing more is sent either way
        if (lease.message_id, lease.attempt) not in done:
            errors[i] = LeaseLost(f"task {lease.message_id}: complete: lease (attempt "
                                  f"{lease.attempt}) no longer held by this worker")
    return errors
