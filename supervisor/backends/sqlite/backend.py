"""The embedded SQLite store: a jobs table, leases with fencing tokens, a stale-lock reaper,
and a dead-owner pass that takes a dead worker's leases back in seconds (backends/sqlite/owner.py).

Every lease write is ``... WHERE seq=? AND token=? AND status='running'``: the token changes
on each receive, so a worker whose lease was reaped and handed out again can never write.
WAL mode lets readers (``jobq-ctl status``) run beside a writer; several supervisors share a
file.  Timestamps in the table are wall-clock epoch seconds because several processes share
them; each process's own lease deadline is monotonic (see lease.py).

Threads: ``receive``/``maintenance``/``push`` and the ctl queries run on the main thread with
its own connection and a short busy timeout (the main loop must not block).  Lease renewals
and settlements run on the lease threads through one shared connection guarded by a lock whose
wait is bounded by each call's timeout -- SQLite serialises writers anyway.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ...core.backoff import Outage
from ...core.settings import format_duration
from ...core.task import Task, parse_or_body
from ..base import BackendBase, BackendConfigError, BackendError, FailedRecord, QueueStatus
from ..common import command_of, held_until
from . import queues as sqlite_queues
from . import versions
from .admin import SqliteAdmin, oldest_pending_age
from .db import (
    connect,
    is_lock_error,
    is_readonly_error,
    is_transient_error,
    missing_columns,
    open_existing,
    set_up,
    transient_text,
    unwritable,
)
from .lease import SqliteLease
from .owner import DeadOwnerPass, TakenBack
from .retention import purge_all, purger

__all__ = ["SqliteBackend", "SqliteLease"]

log = logging.getLogger("jobq.sqlite")
REAP_RETRY_MIN = 5.0  # s: a reaper pass that failed is tried again this soon at first
REAPER_SKIPPED = "stale-lock reaper skipped this round (next try in %(backoff).0fs): %(error)s"

RECEIVE_SQL = (
    "UPDATE jobs SET status='running', attempt=attempt+1, token=token+1, "
    "locked_by=?, owner=?, locked_at=?, locked_until=?, updated_at=? WHERE seq IN ("
    "SELECT seq FROM jobs WHERE queue=? AND status='pending' AND visible_at<=? "
    "ORDER BY priority DESC, seq LIMIT ?) "
    "RETURNING priority, seq, id, body, attempt, token, max_attempts")

MAIN_BUSY_TIMEOUT = 0.5  # the main loop retries on its next turn rather than block
QUICK_WAIT = 0.005  # the most a settlement tried on the main loop may wait for the database
CTL_BUSY_TIMEOUT = 30.0
DEAD_OWNER_EVERY = 2.0  # s between two dead-owner passes of a busy worker (an indexed read)


class SqliteBackend(BackendBase):
    name = "sqlite"
    # Holding a lease a moment costs nothing here (45-min locks, one host): the worker may
    # receive ahead for short tasks (worker/launch.py).
    receive_ahead = True
    change_probe = True  # ``changed``: PRAGMA data_version, from shared memory
    quick_settle = True  # ``quick_writes``: a short task's lease is settled on the main thread
    tells_age = True  # ``oldest_pending_age``: one index step (backends/sqlite/admin.py)
    priorities = True  # receive in (priority DESC, seq) order: jobs_by_priority
    unique_tasks = True  # jobs_unique: a partial unique index over live tasks' keys
    keeps_succeeded = True  # until --retention: ``prune_succeeded`` (backends/sqlite/retention.py)
    requeue_chunk: int | None = 500  # ids per requeue statement: below SQLite's parameter limit

    def __init__(self, path: str, queue: str, worker_id: str, *, max_attempts: int = 5,
                 stale_lock_age: float = 2700.0, reaper_interval: float = 300.0,
                 busy_timeout: float = MAIN_BUSY_TIMEOUT, create: bool = True,
                 serve: bool = False, retention: float = 7 * 86_400.0) -> None:
        """Open (``create``: and set up) the database at ``path`` (main thread).

        ``create=False`` writes nothing: a missing file or one without the jobs table is a
        BackendError (``jobq-ctl size`` on a mistyped path must not make an empty queue).
        ``serve``: a worker starts on the queue (recorded: backends/sqlite/queues.py)."""
        self.path = path
        self.location = os.path.abspath(path)
        self.queue = queue
        self.worker_id = worker_id
        self.max_attempts = max_attempts
        self.stale_lock_age = stale_lock_age
        self.reaper_interval = reaper_interval
        self.settle_timeout = 10.0
        # A lost lease comes back when some worker's reaper sees it stale.
        self.lost_lease_return_delay = stale_lock_age + reaper_interval if reaper_interval else 0.0
        # there is no broker: the task's row stays running until a pass takes it back
        after = (f"{format_duration(stale_lock_age)} after" if stale_lock_age > 0
                 else "once")
        self.lost_lease_return = (
            f"a worker's stale-lock reaper takes the task back {after} its lock expired (or "
            "the dead-owner pass, once this worker is gone)" if reaper_interval else
            "only the dead-owner pass takes the task back, once this worker is gone (the "
            "stale-lock reaper is off: --reaper-interval 0)")
        self._next_reap = 0.0
        # Back off 5, 10, 20 ... s up to the interval itself: a database that stays
        # unwritable (or busy) logs a line per round, not one every 5 s for ever.
        self._reaper_outage = Outage("stale-lock reaper", log, lambda: self.clock(),
                                     backoff_min=REAP_RETRY_MIN, backoff_max=reaper_interval,
                                     log_every=0.0, repeat=True, warning=REAPER_SKIPPED,
                                     recovery=None)
        self._back_since_receive = False  # a pass handed leases back after the last receive
        self.dead_owners = DeadOwnerPass(queue, max_attempts)
        self._next_owner_pass = 0.0
        self.taken_back_at_open: list[TakenBack] = []
        self.clock = time.monotonic  # the reaper's schedule (tests inject a clock)
        self.wall = time.time  # the age of a succeeded task (tests inject a clock)
        self.purger = purger(self, retention, reaper_interval)
        self._data_version = -1
        self._lease_lock = threading.Lock()
        self._lease_busy_ms = 0
        self._quick = threading.local()  # .on: this thread's lease writes may not wait
        self.priorities_known = True  # False: an older database opened read-only
        self.owners_known = True  # the same for the owner column (backends/sqlite/owner.py)
        if not create and not os.path.isfile(path):
            raise BackendError(f"SQLite database {path} does not exist (nothing was pushed "
                               f"there yet?)")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise BackendConfigError(f"--sqlite-path: directory {parent} does not exist")
        try:
            target = path
            if create:
                self._conn = connect(path, busy_timeout)
                set_up(self._conn, path)
                self._check_writable()
                if serve:
                    sqlite_queues.record_served(self._conn, queue, worker_id, time.time())
            else:  # read-only, even where nothing may be written (db.open_existing)
                self._conn, has_jobs, target = open_existing(path, busy_timeout)
                if not has_jobs:
                    raise BackendError(f"SQLite database {path} holds no jobq queue (no jobs "
                                       f"table)")
                versions.check(self._conn, path)  # reads as this build knows: refused
            # a read-only command changes no schema: an older database has no priorities
            missing = {name for name, _ in missing_columns(self._conn)}
            self.priorities_known = "priority" not in missing
            self.owners_known = "owner" not in missing  # not: read-only, older database
            self._lease_conn = connect(target, busy_timeout, setup=create,
                                       uri=target != path)
            if create:  # a worker or a writing jobq-ctl: what dead owners held comes back
                self.taken_back_at_open = self.take_back_dead()
        except BaseException as exc:
            self.close()
            if not isinstance(exc, sqlite3.DatabaseError):
                raise
            if is_lock_error(exc):
                raise BackendError(f"SQLite database {path} is busy: {exc}") from None
            if is_transient_error(exc):  # retried by a worker at start (worker/startup.py)
                raise BackendError(transient_text(path, exc)) from None
            if is_readonly_error(exc) or unwritable(path):
                raise BackendConfigError(f"--sqlite-path: {path} cannot be written "
                                         f"({exc})") from None
            raise BackendConfigError(f"--sqlite-path: {path} is not a usable SQLite database "
                                     f"({exc})") from None

    def _check_writable(self) -> None:
        """Write one header field to its own value and roll back (main thread, at open).

        The schema statements are no-ops on an existing database, so an immutable or
        read-only file would open fine and then fail every receive and reap for ever; a
        database this process can never write is a configuration error (exit 2) instead.
        BEGIN IMMEDIATE alone does not tell: in WAL mode its lock lives in the -shm file."""
        conn = self._conn
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(f"PRAGMA user_version={int(version)}")
            finally:
                conn.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            if is_readonly_error(exc):
                raise BackendConfigError(f"--sqlite-path: {self.path} cannot be written "
                                         f"({exc})") from None
            raise

    # -- plumbing ----------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on the main connection; busy -> BackendError."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise BackendError(f"SQLite busy: {exc}") from None
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            conn.execute("ROLLBACK")
            raise BackendError(f"SQLite commit failed: {exc}") from None

    @contextmanager
    def quick_writes(self) -> Iterator[None]:
        """Lease writes of the calling thread inside this block wait at most ``QUICK_WAIT``
        for the database (main thread: settling a short task's lease without a thread).

        A write that finds the database busy raises BackendError as usual, and the caller
        hands the settlement to the lease's own thread, which waits as long as it needs."""
        self._quick.on = True
        try:
            yield
        finally:
            self._quick.on = False

    def lease_write(self, sql: str, args: tuple, timeout: float) -> int:
        """One UPDATE on the shared lease connection, bounded by timeout (lease threads, or
        the main thread inside ``quick_writes``)."""
        if getattr(self._quick, "on", False):
            timeout = min(timeout, QUICK_WAIT)
        deadline = time.monotonic() + timeout
        if not self._lease_lock.acquire(timeout=max(timeout, 0.0)):
            raise BackendError("SQLite lease connection busy")
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BackendError("SQLite renewal timed out")
            conn = self._lease_conn
            wait_ms = max(1, int(left * 1000))
            # Only when it must shrink (never wait past the deadline) or may grow a lot:
            # every statement costs the GIL twice, and renewals are the hot path.
            if wait_ms < self._lease_busy_ms or wait_ms > self._lease_busy_ms + 1000:
                conn.execute(f"PRAGMA busy_timeout={wait_ms}")
                self._lease_busy_ms = wait_ms
            try:
                # One autocommit statement: SQLite retries its write lock through the busy
                # handler when no transaction was open before it.
                return conn.execute(sql, args).rowcount
            except sqlite3.OperationalError as exc:
                raise BackendError(f"SQLite: {exc}") from None
        finally:
            self._lease_lock.release()

    # -- worker side -------------------------------------------------------------------
    def changed(self) -> bool:
        """True when another connection committed since the last call (main thread).

        ``PRAGMA data_version`` is answered from shared memory, so an idle worker can ask
        every 100 ms and start a freshly pushed task at once instead of at its next poll."""
        try:
            version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return True
        changed = version != self._data_version
        self._data_version = version
        return changed

    def receive(self, max_messages: int, lock_duration: float) -> list[SqliteLease]:
        rows = self._receive_rows(max_messages, lock_duration)
        self._back_since_receive = False
        # Found nothing: what a dead worker held may be waiting to come back (and a batch
        # run must not end "queue empty" before it did).
        if not rows and self.take_back_dead():
            rows = self._receive_rows(max_messages, lock_duration)
        # RETURNING's order is not the subquery's: the priority order again
        return [SqliteLease(self, row[1:], lock_duration)
                for row in sorted(rows, key=lambda r: (-r[0], r[1]))]

    def _receive_rows(self, max_messages: int, lock_duration: float) -> list[tuple]:
        now = time.time()
        try:
            # One autocommit statement (atomic on its own): BEGIN and COMMIT around it cost
            # two more round trips through the GIL per receive, on the hot path.
            return self._conn.execute(
                RECEIVE_SQL, (self.worker_id, self.dead_owners.here, now, now + lock_duration,
                              now, self.queue, now, max_messages)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise BackendError(f"SQLite receive failed: {exc}") from None

    def add_lease_holder(self, pid: int) -> None:
        """Our leases stay ours while process ``pid`` (the lifeline) lives (main thread,
        before the first receive; backends/sqlite/owner.py)."""
        self.dead_owners.add_holder(pid)

    def leases_coming_back(self) -> bool:
        """The last dead-owner pass saw a dead worker's lifeline still killing its tasks: those
        leases come back within seconds; or the stale-lock reaper's last pass failed (a
        locked database): the leases it hands back wait for its next pass, however long ago
        they were lost; or a pass handed leases back after the last receive, which therefore
        could not see them (main thread)."""
        return (self.dead_owners.dying or self._reaper_outage.backoff > 0
                or self._back_since_receive)

    def take_back_dead(self) -> list[TakenBack]:
        """The dead-owner pass (backends/sqlite/owner.py); a failure is logged and takes nothing:
        the
        next pass tries again (main thread)."""
        return self.dead_owners.run_quietly(self._conn, self._tx)

    def maintenance(self) -> None:
        """The dead-owner pass every DEAD_OWNER_EVERY, the stale-lock reaper every
        --reaper-interval, and the purge of succeeded tasks past --retention on its own
        schedule (backends/sqlite/retention.py) (main thread)."""
        if self.clock() >= self._next_owner_pass:
            self._next_owner_pass = self.clock() + DEAD_OWNER_EVERY
            if self.take_back_dead():
                self._data_version = -1  # the change probe says "receive": work came back
                self._back_since_receive = True
        self.purger.maintenance()
        if not self.reaper_interval or self.clock() < self._next_reap:
            return
        now = self.clock()
        self._next_reap = now + self.reaper_interval
        try:
            if self.reap():
                self._back_since_receive = True
        except (BackendError, sqlite3.DatabaseError) as exc:
            self._next_reap = now + self._reaper_outage.failed("reap", exc)
        else:
            self._reaper_outage.succeeded()

    def reap(self) -> int:
        now = time.time()
        cutoff = now - self.stale_lock_age
        with self._tx() as conn:
            failed = conn.execute(
                "UPDATE jobs SET status='failed', locked_until=NULL, "
                "updated_at=?, reason='lease expired on the last attempt (worker ' || "
                "COALESCE(locked_by, '?') || ' stopped renewing)' "
                "WHERE queue=? AND status='running' AND locked_until < ? "
                "AND attempt >= COALESCE(max_attempts, ?)",
                (now, self.queue, cutoff, self.max_attempts)).rowcount
            released = conn.execute(
                "UPDATE jobs SET status='pending', locked_by=NULL, locked_until=NULL, "
                "updated_at=?, visible_at=? WHERE queue=? AND status='running' "
                "AND locked_until < ?", (now, now, self.queue, cutoff)).rowcount
        if released:
            log.info("released stale running jobs count=%d", released)
        if failed:
            log.warning("stale running jobs past their attempts marked failed count=%d", failed)
        return released + failed

    # -- producer / operator side ----------------------------------------------------------
    def push(self, tasks: Sequence[Task]) -> list[str]:
        """Insert the tasks in one transaction; a task whose unique_key a pending or running
        task holds is skipped, that task's id in its place (Backend.push)."""
        now = time.time()
        ids = []
        try:
            with self._tx() as conn:
                sqlite_queues.record_push(conn, self.queue, now)
                for task in tasks:
                    if task.unique_key is not None:
                        live = conn.execute(
                            "SELECT id FROM jobs WHERE queue=? AND unique_key=? "
                            "AND status IN ('pending', 'running')",
                            (self.queue, task.unique_key)).fetchone()
                        if live is not None:
                            ids.append(live[0])
                            continue
                    conn.execute(
                        "INSERT INTO jobs (id, queue, body, status, max_attempts, created_at, "
                        "updated_at, visible_at, priority, unique_key) "
                        "VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)",
                        (task.id, self.queue, task.to_json(), task.max_attempts,
                         max(now, task.not_before or 0), now, task.not_before or 0,
                         task.priority, task.unique_key))
                    ids.append(task.id)
        except sqlite3.IntegrityError:
            raise BackendError("a task with one of these ids is already in the queue; "
                               "nothing was pushed") from None
        except sqlite3.DatabaseError as exc:
            raise BackendError(f"SQLite push failed: {exc}") from None
        return ids

    def push_raw(self, body: str, job_id: str) -> None:
        """Store a body as is (tests and repair tools: lets poison reach the worker)."""
        now = time.time()
        with self._tx() as conn:
            conn.execute("INSERT INTO jobs (id, queue, body, status, created_at, updated_at) "
                         "VALUES (?, ?, ?, 'pending', ?, ?)", (job_id, self.queue, body, now, now))

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            raise BackendError(f"SQLite query failed: {exc}") from None

    def size(self) -> int:
        return self._query("SELECT COUNT(*) FROM jobs WHERE queue=? AND status='pending'",
                           (self.queue,))[0][0]

    def peek(self, n: int) -> list[Task | str]:
        """Tasks carry the time the queue holds them until (``held_until``), not their
        body's: a requeue makes that stale, a retry's back-off is not in it."""
        out: list[Task | str] = []
        now = time.time()
        # in receive order, the ready ones before those not visible yet (an operator's
        # command: the sort over every pending job is fine)
        for body, visible_at in self._query(
                "SELECT body, visible_at FROM jobs WHERE queue=? AND status='pending' "
                "ORDER BY visible_at > ?, "
                f"{'priority DESC, ' if self.priorities_known else ''}seq LIMIT ?",
                (self.queue, now, n)):
            out.append(held_until(parse_or_body(body), visible_at, now))
        return out

    def status(self) -> QueueStatus:
        counts = {s: 0 for s in ("pending", "delayed", "running", "succeeded", "failed")}
        for state, count in self._query("SELECT status, COUNT(*) FROM jobs WHERE queue=? "
                                        "GROUP BY status", (self.queue,)):
            counts[state] = count
        # pending jobs not visible yet (pushed with a delay, or backing off before a retry):
        # a part of "pending", shown apart from the ready ones
        counts["delayed"] = self._query(
            "SELECT COUNT(*) FROM jobs WHERE queue=? AND status='pending' AND visible_at>?",
            (self.queue, time.time()))[0][0]
        rows = self._query(
            "SELECT id, locked_by, attempt, locked_at, locked_until, "
            f"{'owner' if self.owners_known else 'NULL'} FROM jobs "
            "WHERE queue=? AND status='running' ORDER BY seq", (self.queue,))
        running = [{"id": i, "worker": w, "attempt": a, "locked_at": la, "locked_until": lu}
                   for i, w, a, la, lu, _ in rows]
        # a dead worker's task: shown as such until a worker or a jobq-ctl write takes it back
        note = self.dead_owners.mark_gone(running, [row[5] for row in rows])
        return QueueStatus(counts=counts, running=running, note=note)

    def failed(self) -> list[FailedRecord]:
        records = []
        for job_id, attempt, reason, body, tail, status, worker, ts in self._query(
                "SELECT id, attempt, reason, body, output_tail, exit_status, locked_by, "
                "updated_at FROM jobs WHERE queue=? AND status='failed' ORDER BY seq",
                (self.queue,)):
            records.append(FailedRecord(id=job_id, attempts=attempt, reason=reason or "",
                                        command=command_of(body), output_tail=tail or "",
                                        exit_status=status, worker=worker, failed_at=ts,
                                        body=body))
        return records

    def requeue(self, ids: Sequence[str] | None) -> int:
        now = time.time()
        # OR IGNORE: a failed task whose unique key a live task holds stays failed
        sql = ("UPDATE OR IGNORE jobs SET status='pending', attempt=0, visible_at=?, "
               "reason=NULL, updated_at=? WHERE queue=? AND status='failed'")
        args: tuple = (now, now, self.queue)
        if ids is not None:
            if not ids:
                return 0
            sql += f" AND id IN ({','.join('?' * len(ids))})"
            args += tuple(ids)
        with self._tx() as conn:
            return conn.execute(sql, args).rowcount

    def clear(self, failed: bool) -> int:
        state = "failed" if failed else "pending"
        with self._tx() as conn:
            return conn.execute("DELETE FROM jobs WHERE queue=? AND status=?",
                                (self.queue, state)).rowcount

    def require_queue(self) -> None:
        sqlite_queues.require(self._conn, self.queue, self.path)

    def served_queues(self) -> list[str]:
        return sqlite_queues.served(self._conn)

    def prune_succeeded(self, before: float) -> int:
        """Delete the tasks that succeeded before ``before`` (wall clock), in short batches;
        how many (jobq-ctl prune)."""
        return purge_all(self, before)

    def oldest_pending_age(self, now: float) -> float | None:
        return oldest_pending_age(self, now)

    def admin(self) -> SqliteAdmin:
        return SqliteAdmin(self)

    def close(self) -> None:
        for conn in (getattr(self, "_conn", None), getattr(self, "_lease_conn", None)):
            if conn is None:
                continue
            try:
                conn.close()
            except sqlite3.Error:
                pass
