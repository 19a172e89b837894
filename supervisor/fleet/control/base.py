"""The control-store seam: what the fleet layer reads and writes, and how keys are laid out.

Layout (the same keys in both stores; see docs/architecture.rst, "The fleet layer")::

    partition "q:<queue>"   row "flag"                  QueueFlag (paused / resumed)
                            row "cancel:<task id>"      Cancel
                            row "cmd:<worker>:<seq>"    Command for one worker
    partition "w:<queue>"   row "<worker id>"           WorkerRecord
    partition "r:<queue>"   row "<task id>:<attempt>"   ResultRecord (every attempt)
    partition "x:<queue>"   row "<state>:<task id>:<attempt>"
                                                        the same record, again, for the
                                                        states of INDEXED_STATES only
    partition "a:<queue>"   row "<newest first>"        AuditRecord (audit_key)
    partition "u:<queue>"   row "<unique key>"          UniqueClaim: the task that holds a
                                                        unique key (Storage Queue push)
    partition "h:<queue>"   row "<minute>"              HistoryPoint (history_key): the
                                                        dashboard's charts, a row a minute

A worker's whole poll is one range query on its queue's "q:" partition; worker records and
results live in partitions of their own so that a fleet of busy workers (1,000 tasks each)
never makes that poll bigger.  Every attempt writes two result records (running, then how
it ended), so "r:" holds a week of every attempt; the listings of failed and cancelled
attempts read the small "x:" partition instead (entity kind INDEX_KIND, purged alike).
Key parts are escaped (``key_part``) so that no worker id or task id can reach into
another's key range.

Every store method may raise ``ControlStoreError`` (and only that), after at most a few
seconds: the caller (the control thread, jobq-ctl) backs off and tries again.  Wall-clock
times are epoch seconds taken by the caller (``now``), so tests inject the clock.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Callable, Protocol, SupportsInt, Union, runtime_checkable

from .records import (
    CANCEL_TTL,
    AuditRecord,
    Cancel,
    Command,
    HistoryPoint,
    QueueFlag,
    ResultRecord,
    WorkerRecord,
)

log = logging.getLogger("jobq.control")

DAY = 86_400.0
HEARTBEAT_INTERVAL = 15.0  # s between a worker's upserts of its record
LOST_AFTER = 3  # heartbeat intervals without an upsert: shown as "lost"
WORKER_PURGE_AGE = 86_400.0  # s: older worker records are deleted
COMMAND_TTL = 86_400.0  # s an unconsumed command is kept (its worker is gone)
RESULT_TTL = 7 * 86_400.0
AUDIT_TTL = 90 * 86_400.0  # s an operator action is kept
# A unique-key claim older than this is over (the longest a Storage Queue message lives: its
# default TTL), whatever it names: a push takes it over, and the purge deletes it.
CLAIM_TTL = 7 * DAY
HISTORY_TTL = 7 * DAY  # s a history point (one a queue a minute) is kept
# Result states listed often and rare enough to be kept twice ("x:" partition, see above).
INDEXED_STATES = ("failed", "cancelled")
INDEX_KIND = "rindex"  # the stored kind of an "x:" row (its document is a result record)


class ControlStoreError(Exception):
    """A store call failed or timed out; the message is one line without secrets."""


class ControlStoreRefused(ControlStoreError):
    """The store refused the call to this client's identity (a read-only database role):
    retrying will not help."""


class ControlConfigError(ControlStoreError):
    """A store that cannot work as configured (bad connection string, not authorized)."""


@dataclass(frozen=True)
class ControlSnapshot:
    """Everything a worker must know, from one poll.

    ``cancels`` are those recorded after ``cursor`` of the previous poll (all live ones when
    it was None); a cancel may appear again in the next poll or two, so the reader keeps
    the ones it acted on.  ``cursor`` goes into the next poll."""

    flag: Union[QueueFlag, None]
    cancels: tuple[Cancel, ...]
    commands: tuple[Command, ...]
    cursor: Union[str, None]

    @classmethod
    def of_rows(cls, decoded: Iterable[tuple[Sequence[SupportsInt], object]], since: int,
                cursor: Union[str, None]) -> ControlSnapshot:
        """A poll's snapshot from a SQL store's decoded rows ``(row, record)``, ``row[3]`` a
        cancel's rev (fleet/control/sqlite.py and postgres.py); the cursor is the highest
        rev seen above ``since``, else ``cursor`` as it was."""
        flag = None
        cancels: list[Cancel] = []
        commands: list[Command] = []
        top = since
        for row, record in decoded:
            if isinstance(record, QueueFlag):
                flag = record
            elif isinstance(record, Cancel):
                cancels.append(record)
                top = max(top, int(row[3]))
            elif isinstance(record, Command):
                commands.append(record)
        commands.sort(key=lambda c: c.seq)
        return cls(flag, tuple(cancels), tuple(commands), str(top) if top >= 0 else cursor)


@dataclass(frozen=True)
class UniqueClaim:
    """``task_id`` holds unique key ``key`` on ``queue`` since ``when`` (epoch s): a push
    with that key while the task is pending or running is skipped (fleet/control/unique.py).
    ``etag``: the store's version of the row as read (the condition of replace_claim)."""

    queue: str
    key: str
    task_id: str
    when: float
    etag: str = ""


@dataclass(frozen=True)
class PurgeCounts:
    workers: int = 0
    cancels: int = 0
    commands: int = 0
    results: int = 0
    audits: int = 0
    claims: int = 0
    history: int = 0


class ControlStore(Protocol):
    """Implemented by sqlite.SqliteControlStore and azure_table.AzureTableControlStore.

    One instance per thread: neither SQLite connections nor SDK clients are shared."""

    name: str
    # A ``poll`` cursor past every cancel: jobq-ctl reads the flag without listing 7 days
    # of cancels.
    end_cursor: str

    # -- workers (the worker's control thread; jobq-ctl workers) --------------------------
    def put_worker(self, record: WorkerRecord) -> None: ...
    def delete_worker(self, queue: str, worker_id: str) -> None: ...
    def workers(self, queue: Union[str, None] = None) -> list[WorkerRecord]: ...

    # -- what jobq-ctl writes ---------------------------------------------------------------
    def put_cancel(self, cancel: Cancel) -> None: ...
    def put_flag(self, flag: QueueFlag) -> None: ...
    def put_command(self, command: Command) -> None: ...

    # -- what a worker reads ----------------------------------------------------------------
    def poll(self, queue: str, worker_id: str,
             cursor: Union[str, None] = None) -> ControlSnapshot: ...
    def get_cancel(self, queue: str, task_id: str) -> Union[Cancel, None]: ...
    def delete_cancel(self, queue: str, task_id: str) -> None:
        """Forget a cancel (``jobq-ctl requeue`` brings the task back); no error if absent."""
        ...
    def ack_command(self, command: Command) -> None: ...

    # -- listings -----------------------------------------------------------------------------
    def cancels(self, queue: str) -> list[Cancel]: ...
    def put_result(self, result: ResultRecord) -> None: ...
    def put_results(self, batch: Sequence[ResultRecord]) -> None:
        """Upsert every record of ``batch`` (the control thread's flush): SQLite in one
        transaction, Azure Table in one batch transaction per 100 records of a partition.
        A record that is no longer failed or cancelled (a refused settlement corrected to
        lock-lost) takes its "x:" copy with it."""
        ...
    def results(self, queue: str, outcome: Union[str, None] = None) -> list[ResultRecord]:
        """The result records of ``queue`` by time; of one state only if ``outcome`` is
        given (one of INDEXED_STATES: a read of the "x:" partition alone)."""
        ...
    def put_audit(self, record: AuditRecord) -> None: ...
    def audits(self, queue: str, limit: int = 100) -> list[AuditRecord]:
        """The newest ``limit`` operator actions on ``queue``, newest first."""
        ...
    def put_history(self, point: HistoryPoint) -> None:
        """Upsert the point of ``point.minute`` (the dashboard's sampler thread)."""
        ...
    def history(self, queue: str, since: float) -> list[HistoryPoint]:
        """The points of ``queue`` from the minute of ``since`` on, by minute."""
        ...
    def results_of(self, queue: str, task_id: str) -> list[ResultRecord]:
        """The result records of one task's attempts, by attempt (one range query)."""
        ...
    def task_ids(self, queue: str, prefix: str, limit: int) -> list[str]:
        """Up to ``limit`` ids, in order, of the tasks of ``queue`` with a result or cancel
        record whose id starts with ``prefix`` (``task_ids_from_rows``)."""
        ...

    # -- unique keys (jobq-ctl push; the worker's control thread releases) ---------------
    def create_claim(self, claim: UniqueClaim) -> bool:
        """Insert ``claim`` atomically; False (nothing written) if its key is claimed."""
        ...
    def get_claim(self, queue: str, key: str) -> Union[UniqueClaim, None]: ...
    def replace_claim(self, claim: UniqueClaim, etag: str) -> bool:
        """Overwrite the claim of ``claim.key`` only if its row still has ``etag``; False
        (nothing written) if it changed or is gone since it was read."""
        ...
    def release_claim(self, queue: str, key: str, task_id: str) -> None:
        """Delete the claim of ``key`` only if it still names ``task_id``; no error if
        absent."""
        ...

    # -- housekeeping -------------------------------------------------------------------------
    def purge(self, now: float) -> PurgeCounts: ...
    def close(self) -> None: ...


class Watch(Protocol):
    """A store's push of one queue's control writes (the worker's control thread)."""

    def changed(self) -> bool:
        """True (once) when a cancel, flag or command of the queue was written since the
        last call -- or pushes may have been lost (the listener reconnected): poll now."""
        ...

    def close(self) -> None:
        """Stop pushing; its thread and connection end (idempotent)."""
        ...


@runtime_checkable
class Watchable(Protocol):
    """A store that can push (fleet/control/postgres.py: LISTEN/NOTIFY); stores without it
    (SQLite, Azure Table) are polled every control interval only (fleet/agent.py)."""

    def watch(self, queue: str, on_change: Callable[[], None]) -> Union[Watch, None]:
        """Start pushing writes to ``queue``'s partition: ``on_change`` is called (on the
        watch's own thread) when ``changed`` turns true; None when this store does not push
        as configured (``--postgres-notify off``)."""
        ...


def worker_state(record: WorkerRecord, now: float) -> str:
    """The state to show: the record's own, or "lost" after LOST_AFTER missed heartbeats."""
    if now - record.heartbeat > LOST_AFTER * max(record.interval, 1.0):
        return "lost"
    return record.state


def worker_states(records: Sequence[WorkerRecord], now: float) -> dict[str, str]:
    """Each worker's state to show (``worker_state``), by id."""
    return {r.id: worker_state(r, now) for r in records}


def purge_cutoffs(now: float) -> dict[str, float]:
    """Per kind, the ``at`` below which a record is purged."""
    return {"worker": now - WORKER_PURGE_AGE, "cancel": now - CANCEL_TTL,
            "cmd": now - COMMAND_TTL, "result": now - RESULT_TTL,
            INDEX_KIND: now - RESULT_TTL, "audit": now - AUDIT_TTL, "unique": now - CLAIM_TTL,
            "history": now - HISTORY_TTL}


# ----------------------------------------------------------------------------------- keys
_ESCAPE = {c: f"%{ord(c):02X}" for c in '%:/\\#?\'"'}
_ESCAPE.update({chr(i): f"%{i:02X}" for i in (*range(0x20), *range(0x7F, 0xA0))})


def key_part(text: str) -> str:
    """``text`` made safe as part of an Azure Table key, and free of our separator ':'."""
    return "".join(_ESCAPE.get(c, c) for c in text)


def queue_partition(queue: str) -> str:
    return "q:" + key_part(queue)


def worker_partition(queue: str) -> str:
    return "w:" + key_part(queue)


def result_partition(queue: str) -> str:
    return "r:" + key_part(queue)


def claim_partition(queue: str) -> str:
    return "u:" + key_part(queue)


def cancel_key(task_id: str) -> str:
    return "cancel:" + key_part(task_id)


def command_prefix(worker_id: str) -> str:
    return "cmd:" + key_part(worker_id) + ":"


def command_key(command: Command) -> str:
    return command_prefix(command.worker) + key_part(command.seq)


def result_key(result: ResultRecord) -> str:
    return f"{key_part(result.task_id)}:{result.attempt:06d}"


def index_partition(queue: str) -> str:
    return "x:" + key_part(queue)


def index_key(outcome: str, result: ResultRecord) -> str:
    """The "x:" row of ``result`` as if its state were ``outcome``."""
    return f"{outcome}:{result_key(result)}"


def audit_partition(queue: str) -> str:
    return "a:" + key_part(queue)


def audit_key(record: AuditRecord) -> str:
    """Newest first in key order (a range query returns the newest page first): the
    milliseconds counted down from year 2286, then the seq."""
    return f"{10**13 - int(record.when * 1000):013d}:{key_part(record.seq)}"


def history_partition(queue: str) -> str:
    return "h:" + key_part(queue)


def history_key(minute: float) -> str:
    """The row of the minute holding ``minute`` (epoch s): minutes since 1970, in key order."""
    return f"{int(minute // 60):010d}"


def after_prefix(prefix: str) -> str:
    """The smallest string above every string that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def unkey_part(text: str) -> str:
    """The text ``key_part`` escaped (each escape is one character below U+00A0)."""
    return re.sub(r"%([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


# first_row(part, lo, hi): the smallest row key of ``part`` in [lo, hi), or None.
FirstRow = Callable[[str, str, str], Union[str, None]]


def task_ids_from_rows(first_row: FirstRow, queue: str, prefix: str, limit: int) -> list[str]:
    """``ControlStore.task_ids`` on a store's key ranges: the result partition (a row per
    attempt, ``<id>:<attempt>``) and the cancels (``cancel:<id>``), each walked one
    distinct id at a time -- a keyed read per id, however many attempts it has (the
    caller's thread; ``limit`` stays small: ops/short_ids.py)."""
    found: set[str] = set()
    for part, head in ((result_partition(queue), ""), (queue_partition(queue), "cancel:")):
        lo = head + key_part(prefix)
        hi = after_prefix(lo)
        for _ in range(max(0, limit)):
            row = first_row(part, lo, hi)
            if row is None:
                break
            escaped = row[len(head):] if head else row.rpartition(":")[0]
            found.add(unkey_part(escaped))
            # past this id's rows only: an escaped id holds no ':' nor any control char (and
            # PostgreSQL text no NUL: "\x01" is the successor here)
            lo = row + "\x01" if head else escaped + ";"
    return sorted(found)[:limit]


def row_of(record: Union[Cancel, QueueFlag, Command]) -> str:
    if isinstance(record, Cancel):
        return cancel_key(record.task_id)
    if isinstance(record, Command):
        return command_key(record)
    return "flag"


# ------------------------------------------------------------------------------- logging
class OnceLog:
    """Logs a warning once per key (a corrupt record is seen on every poll).  Any thread."""

    def __init__(self, limit: int = 10_000) -> None:
        self._seen: set[object] = set()
        self._lock = threading.Lock()
        self._limit = limit

    def warn(self, key: object, text: str, *args: object) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) >= self._limit:
                self._seen.clear()  # bounded; a flood of bad records may repeat a line
            self._seen.add(key)
        log.warning(text, *args)
        return True


def skipped(once: OnceLog, store: str, where: Sequence[str], error: Exception) -> None:
    once.warn((store, *where, str(error)), "control store %s: skipped record %s: %s",
              store, "/".join(where), error)
