"""The only seam the core sees: Backend and Lease, and the errors a backend may raise.

Every backend maps its SDK's errors onto these:

* ``LeaseLost`` -- definitive: the broker says this worker no longer holds the message
  (404/410, MessageLockLostError, PopReceiptMismatch, a fencing-token mismatch).  The task
  must die at once and the lease must never be settled afterwards.
* ``BackendError`` -- transient: network, timeouts, a busy database.  Callers retry.
* ``BackendConfigError`` -- the configuration can never work (bad credentials, a path
  that is not a database, a malformed URL).  The CLI turns it into exit status 2.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from ..core.task import Task
from .task_list import TaskQuery, TaskRow


class BackendError(Exception):
    """A transient backend failure; the operation may succeed if retried."""


class BackendRefused(BackendError):
    """The queue refused the call to this client's identity (a read-only database role):
    retrying will not help; an operator's tool says so instead of "unavailable"."""


class LeaseLost(BackendError):
    """The broker says the lease is gone; never settle this lease again."""


class BackendConfigError(Exception):
    """The backend cannot work with this configuration (exit status 2)."""


class QueueNotFound(BackendConfigError):
    """The queue does not exist and this backend does not create queues (Service Bus): for
    a worker a configuration error (exit 2); for a read-only ``jobq-ctl`` command, like a
    missing SQLite file or Storage Queue, "does not exist" with exit status 1."""


@dataclass
class FailedRecord:
    """A task that ended in the failed state / dead-letter queue (for ``jobq-ctl failed``)."""

    id: str
    attempts: int
    reason: str
    command: str
    output_tail: str = ""
    exit_status: int | None = None
    worker: str | None = None
    failed_at: float | None = None  # wall-clock epoch seconds
    body: str = ""


@dataclass
class QueueStatus:
    """Counts per state plus the running tasks (for ``jobq-ctl status``)."""

    counts: dict[str, int] = field(default_factory=dict)
    running: list[dict[str, Any]] = field(default_factory=list)
    # What the counts cannot tell (Storage Queue: running and backing-off messages are
    # counted with the waiting ones); None when they mean exactly what they say.
    note: str | None = None


class TakenBack(NamedTuple):
    """A running task taken back from a dead worker (SQLite: its owner process is gone): its
    id, the worker that held it, and where it went (``pending``, or ``failed`` on its last
    attempt)."""

    id: str
    worker: str | None
    status: str


@dataclass(frozen=True)
class TaskDetail:
    """One task's row as a queue that indexes its tasks by id keeps it (the dashboard's task
    page): its status (pending, running, succeeded, failed -- a cancelled task is failed
    with a reason that starts with "cancelled"), the attempt, the raw body, why it failed,
    and while it runs, the worker holding it and the lock's end (wall-clock epoch s)."""

    status: str
    attempt: int
    body: str
    reason: str | None
    worker: str | None
    locked_until: float | None


class QueueAdmin(Protocol):
    """The optional queue-admin capability (``Backend.admin()``): what a queue that indexes
    its tasks by id can answer and do for an operator (jobq-ctl, the dashboard), on the
    caller's thread.  Raises BackendError."""

    def task_states(self, ids: Sequence[str]) -> dict[str, str]:
        """id -> status (pending, running, succeeded, failed) of those of ``ids`` in the
        queue."""
        ...

    def take_back(self, ids: Sequence[str]) -> dict[str, TakenBack]:
        """Those of ``ids`` taken back from a worker that is gone (waiting a moment for one
        whose tasks are still being killed), id -> where each went."""
        ...

    def cancel_pending(self, ids: Sequence[str], reason: str, now: float) -> set[str]:
        """Fail those of ``ids`` still pending with ``reason`` (it starts with
        "cancelled"); the ids it took.  A task a worker claimed meanwhile is untouched."""
        ...

    def task_detail(self, task_id: str) -> TaskDetail | None:
        """The task's row, or None when the queue has no such task."""
        ...

    def cancelled_count(self) -> int:
        """How many cancelled tasks the queue keeps (among the failed ones)."""
        ...

    def list_tasks(self, query: TaskQuery, now: float) -> list[TaskRow]:
        """A page of the queue's tasks, newest first (backends/task_list.py); ``now``:
        wall-clock epoch s (pending vs delayed)."""
        ...

    def ids_starting(self, prefix: str, limit: int) -> list[str]:
        """Up to ``limit`` ids of the queue's tasks that start with ``prefix``, in id order:
        a range of the index on the ids, not a scan (ops/short_ids.py)."""
        ...


class Lease(Protocol):
    """One received message, held by this worker until settled or lost.

    ``renew`` is called only by the lease's own LeaseKeeper thread; the settlement methods
    (``complete``/``release``/``dead_letter``) are called by that same thread once the task
    is over, so a backend needs no lock between renew and settle of one lease.  Different
    leases are used from different threads at once.  On a backend with ``quick_settle``
    (SQLite) the main thread also tries the settlement of a lease whose thread never started,
    inside the backend's ``quick_writes()`` block; a BackendError there hands it to the thread.
    """

    task: Task | None  # None when the body is poison (then format_error is set)
    format_error: str | None
    raw_body: str
    attempt: int  # 1 on the first delivery; counted when the lease is taken
    message_id: str
    lock_duration: float  # seconds of lock granted at receive time
    # The queue it was received from: the backend's own (one of a worker's several queues:
    # multi.py), so that each lease's outcome and record go to its queue.
    queue: str

    def renew(self, timeout: float) -> float:
        """Extend the lock; return the seconds of lock granted from the time the call was sent.

        Must give up (BackendError) within ``timeout`` seconds.  Raises LeaseLost when the
        broker says the lease is gone.
        """
        ...

    def complete(self) -> None:
        """The task succeeded: remove the message for good."""
        ...

    def release(self, count_attempt: bool, delay: float = 0.0) -> None:
        """Put the message back, visible after ``delay`` seconds.

        ``count_attempt=False`` (preemption) gives back the attempt taken at receive time.
        """
        ...

    def dead_letter(self, reason: str, output_tail: str, exit_status: int | None = None) -> None:
        """Give up on the message: failed state / dead-letter queue with the reason."""
        ...


class Backend(Protocol):
    """A queue.  Methods are called from the main thread unless a docstring says otherwise.

    The optional capabilities (``receive_ahead`` with ``max_receive``,
    ``change_probe``/``changed``, ``quick_settle``/``quick_writes``,
    ``tells_age``/``oldest_pending_age``, ``admin()``) are members like any other: every
    backend class inherits ``BackendBase``, whose defaults say "not supported", and the core
    asks the flag.
    """

    name: str
    # Seconds after a lost lease's lock expiry until the message is visible again
    # (SQLite: its reaper's delay; Azure: 0).  --exit-when-empty waits that long.
    lost_lease_return_delay: float
    # How a lease nobody settles (lock lost, deadline passed) comes back, for log lines:
    # "the message becomes visible again when its visibility timeout ends".
    lost_lease_return: str
    # Holding a received lease a moment is cheap: the worker may receive ahead for short
    # tasks (worker/receive_ahead.py).  Default False.
    receive_ahead: bool
    # The most messages one receive may return (Storage Queue: 32, the service's limit);
    # receive-ahead asks up to that many.  None (the default): no limit of the backend's own,
    # and receive-ahead takes at most one lease per slot beyond the free ones.
    max_receive: int | None
    # ``changed()`` is a cheap "anything new?" probe the idle main loop may ask every
    # 100 ms.  Default False (and ``changed`` is never called).
    change_probe: bool
    # The main thread may settle a lease itself inside ``quick_writes()``.  Default False
    # (and ``quick_writes`` is never entered).
    quick_settle: bool
    # The main thread may complete the leases of the tasks that succeeded in one turn
    # together, in one call (``complete_many``).  Default False (and it is never called).
    batch_complete: bool
    # ``oldest_pending_age(now)`` can tell how long the oldest pending task has waited
    # (jobq-ctl status, the autoscaling gauge).  Default False (then it is never asked).
    tells_age: bool
    # Scheduling at push (jobq-ctl push, docs/scheduling.rst): ``priorities`` -- receive
    # honours Task.priority; ``max_delay`` -- the longest Task.not_before ahead the service
    # takes (None: no limit); ``unique_tasks`` -- push skips a task whose unique_key matches
    # a pending or running one and returns that one's id in its place;
    # ``unique_by_control`` -- without that, unique keys work through the control store
    # (fleet/control/unique.py) when there is one.  Defaults: none.
    priorities: bool
    max_delay: float | None
    unique_tasks: bool
    unique_by_control: bool
    # Succeeded tasks stay in the queue until ``prune_succeeded`` (or --retention) deletes
    # them (SQLite); the Azure services delete a message once its task succeeded.  Default
    # False (then ``prune_succeeded`` is never called).
    keeps_succeeded: bool
    # Why a released message is back on the queue at once whatever ``release``'s delay
    # (Service Bus: an abandon cannot be delayed), said in the retry's log line and record;
    # None (the default): the delay is applied.
    no_retry_delay: str | None
    # Ids per ``requeue`` call when many are requeued at once (SQLite: its host parameter
    # limit); None (the default): all in one call.
    requeue_chunk: int | None
    # Where the queue lives, for messages (SQLite: the database file; PostgreSQL: the schema
    # and its server); None (the default): the queue's name says it all.
    location: str | None

    def receive(self, max_messages: int, lock_duration: float) -> Sequence[Lease]: ...

    def push(self, tasks: Sequence[Task]) -> list[str]:
        """Queue the tasks; their ids, in order.  With ``unique_tasks``, a task skipped for
        its unique_key has the live task's id in its place (a different id tells it)."""
        ...

    def size(self) -> int: ...

    def peek(self, n: int) -> list[Task | str]: ...

    def status(self) -> QueueStatus: ...

    def failed(self) -> list[FailedRecord]: ...

    def requeue(self, ids: Sequence[str] | None) -> int:
        """Move failed tasks back to pending (``None`` = all failed); return how many."""
        ...

    def clear(self, failed: bool) -> int:
        """Delete pending tasks (or, with ``failed``, the failed ones); return how many."""
        ...

    def maintenance(self) -> None:
        """Periodic housekeeping on the main thread (SQLite: the stale-lock reaper and the
        purge of succeeded tasks past --retention)."""
        ...

    def prune_succeeded(self, before: float) -> int:
        """Delete the tasks that succeeded before ``before`` (wall-clock epoch seconds);
        how many (jobq-ctl prune; only when ``keeps_succeeded``)."""
        ...

    def changed(self) -> bool:
        """True when the queue may have changed since the last call (main thread; only asked
        when ``change_probe``)."""
        ...

    def wake_with(self, wake: Callable[[], None]) -> None:
        """From now on call ``wake`` (from any thread) when ``changed`` turns true on a thread
        of the backend's own (PostgreSQL: a NOTIFY heard by its listener), so that the idle
        main loop looks at once instead of at its next probe (main thread, before the first
        receive; only when ``change_probe``)."""
        ...

    def quick_writes(self) -> contextlib.AbstractContextManager[None]:
        """A block in which the calling thread's lease writes must not wait for the backend
        (main thread; only entered when ``quick_settle``)."""
        ...

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        """``complete()`` each of ``leases`` -- leases of this backend, each settled by no one
        else -- within a moment, together where the backend can; for each lease in order None
        when it was completed, else what its completion raised (LeaseLost: refused for
        exactly that lease; a BackendError: not done, the lease's keeper thread tries again).
        Called by the worker's completer thread (worker/completer.py), while the main thread
        goes on with its own calls: it must not share their connection.  Only called when
        ``batch_complete``."""
        ...

    def oldest_pending_age(self, now: float) -> float | None:
        """Seconds since the oldest pending task was queued (``now``: wall clock), None when
        none is pending (any one thread at a time; only asked when ``tells_age``)."""
        ...

    def add_lease_holder(self, pid: int) -> None:
        """The leases this worker takes also depend on process ``pid`` (the lifeline helper,
        which kills the tasks when the supervisor dies): SQLite takes a dead worker's leases
        back only once both are gone (main thread, before the first receive)."""
        ...

    def leases_coming_back(self) -> bool:
        """A dead worker's leases are about to come back (SQLite: its lifeline is still
        killing its tasks), so an empty receive does not mean an empty queue (main thread,
        asked by ``--exit-when-empty``)."""
        ...

    def require_queue(self) -> None:
        """Raise QueueNotFound when the queue does not exist (``jobq-ctl`` size, peek,
        status, failed, after opening with ``create=False``).  A backend whose open already
        fails for a missing queue (the Azure ones) keeps the default: nothing to do."""
        ...

    def served_queues(self) -> list[str] | None:
        """The queues some worker has ever started on (SQLite: a push to another warns), or
        None: cannot tell (the default)."""
        ...

    def admin(self) -> QueueAdmin | None:
        """The queue-admin capability, or None (the default) for a queue that keeps no index
        of its tasks by id (the Azure services): callers then fall back on the control
        store's records and on peeking."""
        ...

    def close(self) -> None: ...


class BackendBase:
    """The defaults of the optional capabilities: every backend class inherits this, and
    overrides a flag (with its method) only for what it really supports."""

    receive_ahead: bool = False
    max_receive: int | None = None
    change_probe: bool = False
    quick_settle: bool = False
    batch_complete: bool = False
    tells_age: bool = False
    priorities: bool = False
    max_delay: float | None = None
    unique_tasks: bool = False
    unique_by_control: bool = False
    keeps_succeeded: bool = False
    no_retry_delay: str | None = None
    requeue_chunk: int | None = None
    location: str | None = None
    lost_lease_return: str = "the broker hands the message out again once its lock expires"

    def admin(self) -> QueueAdmin | None:
        """No index of tasks by id."""
        return None

    def changed(self) -> bool:
        """Without a probe the answer is always "maybe" (never asked: ``change_probe``)."""
        return True

    def wake_with(self, wake: Callable[[], None]) -> None:
        """A probe that learns of news only when asked (SQLite) has nobody to wake."""

    def quick_writes(self) -> contextlib.AbstractContextManager[None]:
        """Without quick writes a block is just a block (never entered: ``quick_settle``)."""
        return contextlib.nullcontext()

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        """One lease after the other (never called: ``batch_complete``)."""
        errors: list[BaseException | None] = []
        for lease in leases:
            try:
                lease.complete()
                errors.append(None)
            except Exception as exc:  # each lease's own outcome, as a keeper would see it
                errors.append(exc)
        return errors

    def oldest_pending_age(self, now: float) -> float | None:
        """Cannot tell (never asked: ``tells_age``)."""
        return None

    def add_lease_holder(self, pid: int) -> None:
        """Leases are the broker's to give back when their lock expires: nothing to note."""

    def leases_coming_back(self) -> bool:
        """The broker gives a lease back by its lock alone (``lost_lease_return_delay``)."""
        return False

    def require_queue(self) -> None:
        """Opening the queue already told whether it exists."""

    def served_queues(self) -> list[str] | None:
        """Cannot tell."""
        return None

    def prune_succeeded(self, before: float) -> int:
        """Nothing kept, nothing to delete (never called: ``keeps_succeeded``)."""
        return 0
