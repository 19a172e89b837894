"""Who holds a SQLite lease, and whether that process is gone (the dead-owner pass of backend.py).

Every SQLite worker of a queue runs on one host (a database shared by several hosts over a
network filesystem is not supported: docs/backends.rst, "SQLite").  So a lease can name the
processes it depends on, and any worker or ``jobq-ctl`` write can tell at once that they are
gone, instead of waiting out the 45-minute lock and the stale-lock age (docs/backends.rst,
"Where a backend plugs in").  The ``owner`` column of a running job holds::

    v1 HOST PIDNS BOOT PID:START [PID:START ...]

HOST the host name, PIDNS the pid namespace (``readlink /proc/self/ns/pid``), BOOT the kernel's
boot id; then the supervisor and its lifeline helper, each as pid and start time in clock
ticks since boot (``/proc/PID/stat`` field 22: exact and the same for every reader, unlike a
wall-clock create time, which moves with the clock).  A process is gone when its pid is
unused, a zombie, or used by a process that started at another time (a recycled pid).

The lease is taken back only when *every* process it names is gone: the lifeline kills the
supervisor's tasks after the supervisor dies and exits when none is left, so a task taken
back never runs beside what is left of its previous run.  An owner written on another host
or in another pid namespace (a container with the file on a shared volume) is never judged
here: the stale-lock reaper still takes its leases back once their lock expired.

Pure functions on the caller's thread (the main thread of a worker or of ``jobq-ctl``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Callable, Sequence

from ...core.kernel_files import read_kernel_file
from ..base import BackendError, TakenBack

log = logging.getLogger("jobq.sqlite")

VERSION = "v1"
ALIVE, DYING, GONE, UNKNOWN = "alive", "dying", "gone", "unknown"




def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def host_key() -> tuple[str, str, str]:
    """(host name, pid namespace, boot id) of this process's view of pids."""
    return (socket.gethostname(), _pid_namespace(),
            read_kernel_file("/proc/sys/kernel/random/boot_id", "?", "ascii"))


def start_ticks(pid: int) -> int | None:
    """The start time of live process ``pid`` in clock ticks since boot; None when it is
    gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):  # exited, not reaped yet: its leases are as good as gone
        return None
    return int(fields[19])


def identity(pids: Sequence[int]) -> str | None:
    """The owner string of a lease held by the processes ``pids`` (the first is the
    supervisor); None when one of them cannot be read (then no lease names an owner, and
    only the stale-lock reaper takes them back)."""
    parts = []
    for pid in pids:
        start = start_ticks(pid)
        if start is None:
            return None
        parts.append(f"{pid}:{start}")
    host, pidns, boot = host_key()
    if "?" in (pidns, boot) or not host or any(c.isspace() for c in host):
        return None
    return " ".join([VERSION, host, pidns, boot, *parts])


def owner_state(owner: str, here: str) -> str:
    """``owner``'s state as seen from the process whose identity is ``here``: ALIVE (one of
    its processes lives), DYING (the supervisor is gone, its lifeline still kills what is
    left), GONE, or UNKNOWN (another host or pid namespace, or a format of another version)."""
    if owner == here:
        return ALIVE
    theirs, ours = owner.split(" "), here.split(" ")
    if len(theirs) < 5 or theirs[0] != VERSION or theirs[1:3] != ours[1:3]:
        return UNKNOWN
    if theirs[3] != ours[3]:
        return GONE  # same host and namespace, another boot: every process of it ended
    alive = []
    for entry in theirs[4:]:
        pid, _, start = entry.partition(":")
        try:
            alive.append(start_ticks(int(pid)) == int(start))
        except ValueError:
            return UNKNOWN
    if alive[0]:
        return ALIVE
    return DYING if any(alive) else GONE


def running_owners(conn: sqlite3.Connection, queue: str, here: str) -> dict[str, str]:
    """Owner -> state of every owner of a running job of ``queue`` but ourselves (one read
    down the status index)."""
    rows = conn.execute("SELECT DISTINCT owner FROM jobs WHERE queue=? AND status='running' "
                        "AND owner IS NOT NULL", (queue,)).fetchall()
    return {o: owner_state(o, here) for (o,) in rows if o != here}


def take_back(conn: sqlite3.Connection, queue: str, owners: Sequence[str], now: float,
              max_attempts: int) -> list[TakenBack]:
    """Inside the caller's write transaction: the running jobs of ``owners`` (all gone) go
    back to pending, visible now, their attempt counted -- or to failed on their last one.
    The next receive draws a new fencing token, so nothing the old owner wrote late could
    touch them (backends/sqlite/lease.py)."""
    marks = ",".join("?" * len(owners))
    where = f"WHERE queue=? AND status='running' AND owner IN ({marks})"
    args = (queue, *owners)
    rows = conn.execute(f"SELECT id, locked_by, attempt >= COALESCE(max_attempts, ?) "
                        f"FROM jobs {where} ORDER BY seq", (max_attempts, *args)).fetchall()
    conn.execute(
        "UPDATE jobs SET status='failed', locked_until=NULL, updated_at=?, "
        "reason='worker ' || COALESCE(locked_by, '?') || ' is gone (its process ended) on "
        f"the last attempt' {where} AND attempt >= COALESCE(max_attempts, ?)",
        (now, *args, max_attempts))
    conn.execute("UPDATE jobs SET status='pending', locked_by=NULL, locked_until=NULL, "
                 f"updated_at=?, visible_at=? {where}", (now, now, *args))
    return [TakenBack(i, w, "failed" if last else "pending") for i, w, last in rows]


class DeadOwnerPass:
    """The dead-owner pass of one SqliteBackend (its main thread): who we are, and what the
    last pass saw."""

    def __init__(self, queue: str, max_attempts: int, pids: Sequence[int] = ()) -> None:
        """``pids``: the processes our leases depend on (default: this one)."""
        self.queue = queue
        self.max_attempts = max_attempts
        self.pids = list(pids) or [os.getpid()]
        self.here = identity(self.pids)  # None: no lease names an owner, no pass runs
        self.dying = False  # the last pass saw an owner whose lifeline is still at work
        self.failing = False  # the last pass failed (logged once an outage)

    def add_holder(self, pid: int) -> None:
        """Our leases also depend on process ``pid`` (the lifeline): they are taken back only
        once it is gone too.  Before the first receive."""
        self.pids.append(pid)
        self.here = identity(self.pids)

    def mark_gone(self, running: list[dict], owners: Sequence[str | None]) -> str | None:
        """Set ``owner_gone`` on each of ``running`` (the rows of ``jobq-ctl status``, owners
        in the same order) whose owner is gone or dying; the note status prints, or None."""
        states: dict[str, str] = {}
        gone = 0
        for row, owner in zip(running, owners):
            if owner is None or self.here is None:
                continue
            if owner not in states:
                states[owner] = owner_state(owner, self.here)
            if states[owner] in (GONE, DYING):
                row["owner_gone"] = True
                gone += 1
        if not gone:
            return None
        return (f"{gone} running task(s) belong to a worker that is gone (its process ended): "
                "the next worker or jobq-ctl write takes them back, counting the attempt")

    def run_quietly(self, conn: sqlite3.Connection,
                    tx: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
                    ) -> list[TakenBack]:
        """``run``, but a busy or unwritable database is a log line (once an outage) and
        nothing taken: every pass is retried soon anyway."""
        try:
            taken = self.run(conn, tx)
        except BackendError as exc:
            if not self.failing:
                log.warning("dead-owner pass failed (tried again at the next one): %s", exc)
            self.failing = True
            return []
        self.failing = False
        return taken

    def run(self, conn: sqlite3.Connection,
            tx: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
            ) -> list[TakenBack]:
        """Take back the running jobs of ``queue`` whose owner is gone: a read on ``conn``,
        and ``tx()``, a write transaction, only when there is something to take.  Raises
        BackendError."""
        if self.here is None:
            return []
        try:
            states = running_owners(conn, self.queue, self.here)
            self.dying = DYING in states.values()
            gone = sorted(o for o, state in states.items() if state == GONE)
            if not gone:
                return []
            with tx() as wconn:
                taken = take_back(wconn, self.queue, gone, time.time(), self.max_attempts)
        except sqlite3.DatabaseError as exc:
            raise BackendError(f"SQLite dead-owner pass failed: {exc}") from None
        for worker in sorted({t.worker or "?" for t in taken}):
            mine = [f"{t.id} {'failed (last attempt)' if t.status == 'failed' else 'pending'}"
                    for t in taken if (t.worker or "?") == worker]
            log.warning("worker %s is gone (its process ended): took back %d running task(s): "
                        "%s", worker, len(mine), ", ".join(mine[:10])
                        + (" ..." if len(mine) > 10 else ""))
        return taken
