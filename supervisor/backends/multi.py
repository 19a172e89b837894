"""Several queues behind one Backend: ``--queue high,default,low`` (docs/backends.rst,
"Several queues per worker").

One backend instance per queue, opened at start (``open_backend``); the worker sees one
Backend.  ``receive`` asks the queues in ``--queue-order``:

* ``strict``: the first queue for everything wanted, then the next for what is still
  missing, and so on -- a slot takes from the first queue that has work;
* ``round-robin``: the wanted number is shared out one by one, starting with the queue after
  the one that gave the last lease of the previous receive, and the leases are interleaved in
  that order, so that the tasks started alternate between the queues that have work.

Each lease is the queue's own (it renews and settles on its queue's backend, and fails into
its queue's failed place); ``Lease.queue`` tells its queue.  An idle poll costs one receive per
queue (no backend has a receive over several queues; SQLite's change probe spares most).

Main thread only, like every Backend (the leases are used by their keeper threads).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Callable, NoReturn

from ..core.backoff import Outage
from ..core.task import Task
from .base import (
    Backend,
    BackendBase,
    BackendConfigError,
    BackendError,
    FailedRecord,
    Lease,
    QueueAdmin,
    QueueStatus,
    TakenBack,
    TaskDetail,
)
from .task_list import TaskQuery, TaskRow

log = logging.getLogger("jobq.worker")
ERROR_LOG_EVERY = 60.0  # s between two lines about a failing queue beside working ones
FAILED_BESIDE = "receive from queue %(call)s failed (the other queues go on): %(error)s"


class MultiQueueBackend(BackendBase):
    """The worker's Backend over ``backends`` (name -> backend, in ``--queue`` order)."""

    def __init__(self, backends: dict[str, Backend], order: str = "strict",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.queues = list(backends)
        self.backends = backends
        self.round_robin = order == "round-robin"
        self._start = 0  # round-robin: the queue asked first by the next receive
        # Paused queues (jobq-ctl pause --queue NAME): receive skips them.  Replaced whole by
        # the control thread (fleet/agent_group.py), read by the main thread.
        self.paused: frozenset[str] = frozenset()
        self._errors: list[tuple[str, Exception]] = []  # of the receive under way
        # Nothing to pace here (the worker paces a receive that raised): only the line.
        self._failed_beside = Outage("queue", log, clock, log_every=ERROR_LOG_EVERY,
                                     repeat=True, warning=FAILED_BESIDE, recovery=None)
        first = backends[self.queues[0]]
        self.name = first.name
        every = list(backends.values())
        self.lost_lease_return_delay = max(b.lost_lease_return_delay for b in every)
        self.lost_lease_return = first.lost_lease_return  # one kind of backend for every queue
        self.receive_ahead = all(b.receive_ahead for b in every)
        self.change_probe = all(b.change_probe for b in every)
        self.quick_settle = all(b.quick_settle for b in every)
        self.batch_complete = all(b.batch_complete for b in every)
        self.tells_age = all(b.tells_age for b in every)
        self.no_retry_delay = first.no_retry_delay  # one kind of backend for every queue

    def receive(self, max_messages: int, lock_duration: float) -> list[Lease]:
        if self.round_robin:
            return self._receive_round_robin(max_messages, lock_duration)
        leases: list[Lease] = []
        paused = self.paused
        for name in self.queues:
            want = max_messages - len(leases)
            if want <= 0:
                break
            if name not in paused:
                leases.extend(self._take(name, want, lock_duration))
        return self._outcome(leases)

    def _receive_round_robin(self, max_messages: int, lock_duration: float) -> list[Lease]:
        n, paused = len(self.queues), self.paused
        turn = [self.queues[(self._start + i) % n] for i in range(n)]
        turn = [name for name in turn if name not in paused]
        share = {name: max_messages // len(turn) + (1 if i < max_messages % len(turn) else 0)
                 for i, name in enumerate(turn)} if turn else {}
        got = {name: self._take(name, share[name], lock_duration) if share[name] else []
               for name in turn}
        # What an empty queue left over goes to the ones that filled their share, in turn.
        short = max_messages - sum(len(v) for v in got.values())
        for name in turn:
            if short <= 0:
                break
            if share[name] and len(got[name]) == share[name]:
                more = self._take(name, short, lock_duration)
                got[name].extend(more)
                short -= len(more)
        leases: list[Lease] = []
        last = None
        for i in range(max((len(v) for v in got.values()), default=0)):
            for name in turn:
                if i < len(got[name]):
                    leases.append(got[name][i])
                    last = name
        if last is not None:
            self._start = (self.queues.index(last) + 1) % n
        return self._outcome(leases)

    def _take(self, name: str, want: int, lock_duration: float) -> list[Lease]:
        """One queue's receive.  A queue that fails is skipped for this receive: leases
        already taken from another must reach the worker, or they would sit out their lock."""
        try:
            return list(self.backends[name].receive(want, lock_duration))
        except BackendConfigError:
            raise
        except Exception as exc:  # what the worker retries: BackendError, an SDK's bug
            self._errors.append((name, exc))
            return []

    def _outcome(self, leases: list[Lease]) -> list[Lease]:
        """The leases; when there are none and a queue failed, its error for the worker's
        retry (then logged there); a failure beside leases is logged here, once a minute."""
        errors, self._errors = self._errors, []
        if errors and not leases:
            raise errors[0][1]
        if errors:
            self._failed_beside.failed(*errors[0])
        return leases

    def changed(self) -> bool:
        """Any queue's probe says maybe; every probe is asked, so each forgets what it saw."""
        return any([b.changed() for b in self.backends.values()])

    def wake_with(self, wake: Callable[[], None]) -> None:
        for b in self.backends.values():
            b.wake_with(wake)

    @contextlib.contextmanager
    def quick_writes(self) -> Iterator[None]:
        """Every queue's quick-writes block (a lease writes through its own queue's)."""
        with contextlib.ExitStack() as stack:
            for b in self.backends.values():
                stack.enter_context(b.quick_writes())
            yield

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        """Each queue's leases completed together by their own queue's backend."""
        errors: list[BaseException | None] = [None] * len(leases)
        by_queue: dict[str, list[int]] = {}
        for i, lease in enumerate(leases):
            by_queue.setdefault(lease.queue, []).append(i)
        for queue, at in by_queue.items():
            for i, error in zip(at, self.backends[queue].complete_many([leases[i] for i in at])):
                errors[i] = error
        return errors

    def maintenance(self) -> None:
        for b in self.backends.values():
            b.maintenance()

    def add_lease_holder(self, pid: int) -> None:
        for b in self.backends.values():
            b.add_lease_holder(pid)

    def leases_coming_back(self) -> bool:
        return any(b.leases_coming_back() for b in self.backends.values())

    def oldest_pending_age(self, now: float) -> float | None:
        ages = [a for a in (b.oldest_pending_age(now) for b in self.backends.values())
                if a is not None]
        return max(ages, default=None)

    def size(self) -> int:
        """Pending tasks over all the queues (the metrics file's depth gauge)."""
        return sum(b.size() for b in self.backends.values())

    def admin(self) -> QueueAdmin | None:
        """Every queue's admin as one (a task id names one task in one queue), when each
        queue has one."""
        admins = [b.admin() for b in self.backends.values()]
        every = [a for a in admins if a is not None]
        return MultiQueueAdmin(every) if len(every) == len(admins) else None

    # The queue commands are jobq-ctl's, and it opens one queue at a time (ctl/main.py).
    @staticmethod
    def _one_queue() -> NoReturn:
        raise BackendConfigError("--queue: this command takes one queue")

    def push(self, tasks: Sequence[Task]) -> list[str]:
        self._one_queue()

    def peek(self, n: int) -> list[Task | str]:
        self._one_queue()

    def requeue(self, ids: Sequence[str] | None) -> int:
        self._one_queue()

    def clear(self, failed: bool) -> int:
        self._one_queue()

    def status(self) -> QueueStatus:
        self._one_queue()

    def failed(self) -> list[FailedRecord]:
        self._one_queue()

    def close(self) -> None:
        for b in self.backends.values():
            b.close()


class MultiQueueAdmin(QueueAdmin):
    """The queue-admin capability over several queues: each call asks every queue (the
    caller's thread)."""

    def __init__(self, admins: list[QueueAdmin]) -> None:
        self.admins = admins

    def task_states(self, ids: Sequence[str]) -> dict[str, str]:
        return {k: v for a in self.admins for k, v in a.task_states(ids).items()}

    def take_back(self, ids: Sequence[str]) -> dict[str, TakenBack]:
        return {k: v for a in self.admins for k, v in a.take_back(ids).items()}

    def cancel_pending(self, ids: Sequence[str], reason: str, now: float) -> set[str]:
        return {i for a in self.admins for i in a.cancel_pending(ids, reason, now)}

    def ids_starting(self, prefix: str, limit: int) -> list[str]:
        return sorted({i for a in self.admins for i in a.ids_starting(prefix, limit)})[:limit]

    def task_detail(self, task_id: str) -> TaskDetail | None:
        return next((d for a in self.admins if (d := a.task_detail(task_id)) is not None),
                    None)

    def cancelled_count(self) -> int:
        return sum(a.cancelled_count() for a in self.admins)

    def list_tasks(self, query: TaskQuery, now: float) -> list[TaskRow]:
        # a page's cursor is one queue's place: several queues would need one each
        if len(self.admins) != 1:
            raise BackendError("tasks are listed one queue at a time (--queue NAME)")
        return self.admins[0].list_tasks(query, now)
