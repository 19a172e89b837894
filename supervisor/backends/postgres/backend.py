"""The PostgreSQL queue: a jobs table shared by many hosts, leases fenced by (id, owner,
attempt), lock times from the database clock (docs/backends.rst, "PostgreSQL").

``receive`` is ONE statement: the wanted number of pending rows in (priority DESC, run_at, id)
order, ``FOR UPDATE SKIP LOCKED`` (two workers never wait on each other's rows), set running
with this process's owner token, ``locked_until = now() + lease`` and the attempt counted.  The
owner token is the worker id plus a nonce made once per process start (``START_NONCE``): a
user-set ``--worker-id`` reused by a restarted or a second worker can never match a fence of
another start (peers broke on reused names); the ``worker`` column holds the plain worker id,
which is what status, failed and the dashboard show.

Threads: the main thread (receive, push, maintenance and every ctl query) uses the main pool;
lease renewals and settlements use the lease pool, so a renewal never queues behind a slow
receive or an admin query, each statement with a statement timeout below the time the caller
gave it (lease.py).  Admin queries: admin.py; the retention purge: retention.py.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast

from ...core.task import Task, parse_or_body
from ..base import BackendBase, FailedRecord, Lease, QueueNotFound, QueueStatus
from ..common import command_of, held_until
from .admin import PostgresAdmin, oldest_pending_age
from .db import Database
from .lease import PostgresLease, complete_all
from .listener import QueueWake
from .reaper import ExpiredLeaseReaper
from .retention import purge_all, purger

__all__ = ["PostgresBackend", "PostgresLease", "START_NONCE"]

log = logging.getLogger("jobq.postgres")

# Made once per process start: with the worker id, this process's owner token (see above).
START_NONCE = uuid.uuid4().hex[:12]
RETENTION_DEFAULT = 7 * 86_400.0

STATES = ("pending", "delayed", "running", "succeeded", "failed")


class PostgresBackend(BackendBase):
    """One queue of the jobs table (several: one backend each, backends/multi.py)."""

    name = "postgres"
    # A held lease costs one row and a heartbeat; claiming several rows in one statement is
    # what makes short tasks fast (worker/receive_ahead.py).
    receive_ahead = True
    # Short tasks end several a turn: their rows are completed together, one statement per
    # batch on the worker's completer thread, with no keeper thread nor a transaction per
    # task (complete_many).
    batch_complete = True
    tells_age = True  # ``oldest_pending_age``: one index step per priority (admin.py)
    priorities = True  # receive in (priority DESC, run_at, id) order: the pending index
    unique_tasks = True  # a partial unique index over pending and running rows' keys
    keeps_succeeded = True  # until --retention (retention.py)
    max_delay: float | None = None  # run_at is a timestamp: any time ahead
    requeue_chunk: int | None = 5000  # ids per requeue statement: one array parameter
    # A lease whose holder died comes back when its lock passed (the expired-lease pass).
    lost_lease_return_delay = 0.0
    # there is no broker: the task's row stays running until a worker's pass takes it back
    lost_lease_return = ("a worker's expired-lease pass takes the task back once its lock "
                         "has expired (locked_until)")

    def __init__(self, db: Database, queue: str, worker_id: str, *,
                 retention: float = RETENTION_DEFAULT, reaper_interval: float = 300.0,
                 serve: bool = False, reaper: ExpiredLeaseReaper | None = None,
                 wake: QueueWake | None = None) -> None:
        """A backend on ``db`` (opened, its schema checked: open.py) for ``queue`` (main
        thread).  ``serve``: a worker starts on the queue (recorded in the queues table).
        A worker's: ``reaper``, its expired-lease pass (reaper.py); ``wake``, its share of
        the LISTEN connection (listener.py; None: ``--postgres-notify off``, poll only)."""
        self.db = db
        self.queue = queue
        self.worker_id = worker_id
        self.owner = f"{worker_id}#{START_NONCE}"
        self.jobs = db.tables.jobs
        self.queues_table = db.tables.queues
        self.location = db.location
        self.clock: Callable[[], float] = time.monotonic  # the schedule (tests inject one)
        self.wall: Callable[[], float] = time.time
        self.purger = purger(self, retention, reaper_interval)
        # Housekeeping passes in order (maintenance): each is called on the main thread and
        # keeps its own schedule.  The expired-lease reaper goes here too.
        self.passes: list[Callable[[], object]] = [self.purger.maintenance]
        # pg-wake (reaper.py, listener.py): the expired-lease pass goes first; the change
        # probe reads the wake-up flag of this queue
        self.reaper = reaper
        self._taken_since_receive = False  # the reaper handed leases back since a receive
        if reaper is not None:
            self.passes.insert(0, self._reap)
            # a lease lost here comes back at a pass after its lock's end + the stale age
            self.lost_lease_return_delay = reaper.stale_age + reaper.interval
        self.wake = wake
        self.change_probe = wake is not None
        if serve:
            self._execute(f"INSERT INTO {self.queues_table} (name, first_served) "
                          "VALUES (%s, now()) ON CONFLICT (name) DO UPDATE SET first_served = "
                          f"COALESCE({self.queues_table}.first_served, now())", (queue,))

    # -- plumbing ------------------------------------------------------------------------
    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        """One statement on the main pool (autocommit); its rows.  Raises BackendError."""
        with self.db.main("query") as conn:
            cur = conn.execute(sql, args)
            return cur.fetchall() if cur.description is not None else []

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        """One statement on the main pool; the rows it changed."""
        with self.db.main("write") as conn:
            return conn.execute(sql, args).rowcount

    def lease_write(self, sql: str, args: tuple[Any, ...], timeout: float) -> list[tuple]:
        """One statement on the lease pool within ``timeout`` (lease threads; lease.py)."""
        return self.db.lease_statement(sql, args, timeout)

    def batch_write(self, sql: str, args: tuple[Any, ...]) -> list[tuple]:
        """One statement on the main pool, bounded (the worker's completer thread, beside
        the main thread's calls on another connection of the pool; lease.complete_all)."""
        return self.db.main_statement("complete", sql, args)

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        """The tasks that succeeded in one turn: one fenced UPDATE (lease.complete_all)."""
        return complete_all(self, [cast(PostgresLease, lease) for lease in leases])

    # -- worker side ---------------------------------------------------------------------
    def receive(self, max_messages: int, lock_duration: float) -> list[PostgresLease]:
        """Claim up to ``max_messages`` ready tasks in one statement (main thread)."""
        if max_messages <= 0:
            return []
        rows = self._query(
            f"WITH c AS MATERIALIZED (SELECT id FROM {self.jobs} WHERE queue=%s "
            "AND state='pending' AND run_at <= now() ORDER BY priority DESC, run_at, id "
            f"LIMIT %s FOR UPDATE SKIP LOCKED) UPDATE {self.jobs} j SET state='running', "
            "owner=%s, worker=%s, attempt=j.attempt + 1, started_at=now(), ended_at=NULL, "
            "locked_until = now() + make_interval(secs => %s) FROM c WHERE j.id = c.id "
            "RETURNING j.id, j.body, j.attempt, EXTRACT(EPOCH FROM j.locked_until - now()), "
            "j.priority, j.run_at",
            (self.queue, max_messages, self.owner, self.worker_id, lock_duration))
        self._taken_since_receive = False  # pg-wake: what the reaper handed back was seen
        # RETURNING's order is not the claim's: the receive order again
        rows.sort(key=lambda r: (-r[4], r[5], r[0]))
        return [PostgresLease(self, row, self.owner) for row in rows]

    def maintenance(self) -> None:
        """Every housekeeping pass in ``passes``, each on its own schedule (main thread)."""
        for one_pass in self.passes:
            one_pass()

    # pg-wake: the reaper's pass, the change probe, and what --exit-when-empty waits for
    def _reap(self) -> None:
        """The expired-lease pass when due (reaper.py) (main thread)."""
        assert self.reaper is not None
        if self.reaper.maintenance():
            self._taken_since_receive = True

    def changed(self) -> bool:
        """This queue was NOTIFYed, or the listener (re)connected, since the last call (main
        thread; only with ``change_probe``: a listener)."""
        return self.wake is None or self.wake.changed()

    def wake_with(self, wake: Callable[[], None]) -> None:
        """A NOTIFY for this queue wakes the main loop at once (listener.py)."""
        if self.wake is not None:
            self.wake.wake_with(wake)

    def leases_coming_back(self) -> bool:
        """The reaper's last pass failed (expired leases wait for the next one), or it handed
        leases back after the last receive, which could not see them (main thread)."""
        return self.reaper is not None and (self.reaper.outage.backoff > 0
                                            or self._taken_since_receive)

    # -- producer / operator side --------------------------------------------------------
    def push(self, tasks: Sequence[Task]) -> list[str]:
        """Insert the tasks in one transaction with the wake-up NOTIFY; a task whose
        unique_key a pending or running task holds is skipped, that task's id in its place
        (Backend.push).  Tasks of one push keep their order: each is ready a microsecond
        after the one before it (the receive orders by run_at within a priority)."""
        if not tasks:
            return []
        bodies = [t.to_json() for t in tasks]
        with self.db.main("push", duplicate="a task with one of these ids is already in the "
                          "queue; nothing was pushed") as conn, conn.transaction():
            inserted = {row[0] for row in conn.execute(
                f"INSERT INTO {self.jobs} (id, queue, state, priority, run_at, body, "
                "unique_key, attempt, created_at) SELECT t.id, %s, 'pending', t.priority, "
                "GREATEST(to_timestamp(t.not_before), now() + (t.n - 1) * "
                "interval '1 microsecond'), t.body, t.unique_key, 0, now() FROM unnest("
                "%s::text[], %s::smallint[], %s::float8[], %s::text[], %s::text[]) WITH "
                "ORDINALITY AS t(id, priority, not_before, body, unique_key, n) ORDER BY t.n "
                "ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL AND state IN "
                "('pending', 'running') DO NOTHING RETURNING id",
                (self.queue, [t.id for t in tasks], [t.priority for t in tasks],
                 [t.not_before for t in tasks], bodies, [t.unique_key for t in tasks]))}
            ids = [t.id for t in tasks]
            skipped = {t.unique_key for t in tasks if t.id not in inserted}
            if skipped:
                live = dict(conn.execute(
                    f"SELECT unique_key, id FROM {self.jobs} WHERE queue=%s AND unique_key = "
                    "ANY(%s) AND state IN ('pending', 'running')",
                    (self.queue, list(skipped))).fetchall())
                ids = [t.id if t.id in inserted else live.get(t.unique_key, t.id)
                       for t in tasks]
            conn.execute(f"INSERT INTO {self.queues_table} (name) VALUES (%s) "
                         "ON CONFLICT (name) DO NOTHING", (self.queue,))
            if inserted:
                conn.execute("SELECT pg_notify(%s, %s)", (self.db.wake_channel, self.queue))
        return ids

    def push_raw(self, body: str, job_id: str) -> None:
        """Store a body as is (tests and repair tools: lets poison reach the worker)."""
        self._execute(f"INSERT INTO {self.jobs} (id, queue, state, body, priority, run_at, "
                      "attempt, created_at) VALUES (%s, %s, 'pending', %s, 5, now(), 0, now())",
                      (job_id, self.queue, body))

    def size(self) -> int:
        return int(self._query(f"SELECT count(*) FROM {self.jobs} WHERE queue=%s "
                               "AND state='pending'", (self.queue,))[0][0])

    def peek(self, n: int) -> list[Task | str]:
        """In receive order, the ready ones before those held back; each with the time the
        queue holds it until (``held_until``), not its body's."""
        if n <= 0:
            return []
        rows = self._query(
            f"SELECT body, EXTRACT(EPOCH FROM run_at), EXTRACT(EPOCH FROM now()) FROM "
            f"{self.jobs} WHERE queue=%s AND state='pending' ORDER BY run_at > now(), "
            "priority DESC, run_at, id LIMIT %s", (self.queue, n))
        return [held_until(parse_or_body(body), float(at), float(now))
                for body, at, now in rows]

    def status(self) -> QueueStatus:
        counts = dict.fromkeys(STATES, 0)
        for state, count in self._query(
                f"SELECT CASE WHEN state='pending' AND run_at > now() THEN 'delayed' ELSE "
                f"state END, count(*) FROM {self.jobs} WHERE queue=%s GROUP BY 1",
                (self.queue,)):
            counts[state] = count
        # "delayed" is a part of "pending" (pushed with a delay, or backing off), shown apart
        counts["pending"] += counts["delayed"]
        rows = self._query(
            "SELECT id, worker, attempt, EXTRACT(EPOCH FROM started_at), "
            f"EXTRACT(EPOCH FROM locked_until) FROM {self.jobs} WHERE queue=%s AND "
            "state='running' ORDER BY started_at, id", (self.queue,))
        running = [{"id": i, "worker": w, "attempt": a,
                    "locked_at": None if la is None else float(la),
                    "locked_until": None if lu is None else float(lu)}
                   for i, w, a, la, lu in rows]
        return QueueStatus(counts=counts, running=running)

    def failed(self) -> list[FailedRecord]:
        return [FailedRecord(id=i, attempts=attempt, reason=reason or "",
                             command=command_of(body), output_tail=tail or "",
                             exit_status=status, worker=worker,
                             failed_at=None if at is None else float(at), body=body)
                for i, attempt, reason, body, tail, status, worker, at in self._query(
                    "SELECT id, attempt, reason, body, output_tail, exit_status, worker, "
                    f"EXTRACT(EPOCH FROM ended_at) FROM {self.jobs} WHERE queue=%s AND "
                    "state='failed' ORDER BY ended_at, id", (self.queue,))]

    def requeue(self, ids: Sequence[str] | None) -> int:
        """Failed tasks back to pending, attempts from 0.  A failed task whose unique key a
        live task holds (or another task requeued with it) stays failed."""
        if ids is not None and not ids:
            return 0
        where = "" if ids is None else " AND id = ANY(%s)"
        args: tuple = (self.queue,) if ids is None else (self.queue, list(ids))
        with self.db.main("requeue") as conn, conn.transaction():
            rows = conn.execute(
                f"SELECT id, unique_key FROM {self.jobs} WHERE queue=%s AND state='failed'"
                f"{where} ORDER BY ended_at, id FOR UPDATE", args).fetchall()
            keys = {key for _, key in rows if key is not None}
            taken = {key for (key,) in conn.execute(
                f"SELECT unique_key FROM {self.jobs} WHERE queue=%s AND unique_key = ANY(%s) "
                "AND state IN ('pending', 'running')", (self.queue, list(keys)))} if keys else set()
            chosen = []
            for task_id, key in rows:
                if key is None or key not in taken:
                    chosen.append(task_id)
                    if key is not None:
                        taken.add(key)
            return conn.execute(
                f"UPDATE {self.jobs} SET state='pending', attempt=0, run_at=now(), "
                "reason=NULL, output_tail=NULL, exit_status=NULL, ended_at=NULL, worker=NULL, "
                "owner=NULL, locked_until=NULL WHERE id = ANY(%s) AND state='failed'",
                (chosen,)).rowcount

    def clear(self, failed: bool) -> int:
        return self._execute(f"DELETE FROM {self.jobs} WHERE queue=%s AND state=%s",
                             (self.queue, "failed" if failed else "pending"))

    def require_queue(self) -> None:
        """QueueNotFound unless a task was pushed to the queue or a worker served it."""
        known = self._query(
            f"SELECT EXISTS (SELECT 1 FROM {self.jobs} WHERE queue=%s) OR EXISTS "
            f"(SELECT 1 FROM {self.queues_table} WHERE name=%s)", (self.queue, self.queue))
        if known[0][0]:
            return
        names = [n for (n,) in self._query(f"SELECT name FROM {self.queues_table} UNION "
                                           f"SELECT DISTINCT queue FROM {self.jobs} ORDER BY 1")]
        there = f"its queues: {', '.join(names)}" if names else "it has no queue yet"
        raise QueueNotFound(f"queue {self.queue!r} does not exist in {self.location} ({there}; "
                            f"a queue exists once a task was pushed to it or a worker served "
                            f"it)")

    def served_queues(self) -> list[str]:
        return [n for (n,) in self._query(f"SELECT name FROM {self.queues_table} "
                                          "WHERE first_served IS NOT NULL ORDER BY name")]

    def prune_succeeded(self, before: float) -> int:
        """Delete the tasks that succeeded before ``before`` (wall clock), in short batches;
        how many (jobq-ctl prune)."""
        return purge_all(self, before)

    def oldest_pending_age(self, now: float) -> float | None:
        return oldest_pending_age(self, now)

    def admin(self) -> PostgresAdmin:
        return PostgresAdmin(self)

    def close(self) -> None:
        if self.wake is not None:  # pg-wake: the last queue's close ends the listener
            self.wake.close()
            self.wake = None
        self.db.close()

