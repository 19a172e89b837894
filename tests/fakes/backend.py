"""A backend for unit tests: a queue of message ids behind the Backend seam."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from supervisor.backends.base import BackendBase, BackendError
from tests.fakes.lease import FakeLease


class FakeBackend(BackendBase):
    """``receive`` hands out ``items`` (message ids) as FakeLeases, recording each call's
    ``max_messages`` in ``calls``; ``size`` answers ``depth`` when set, else the items left,
    and records the calling thread in ``threads`` (raising BackendError while ``fail``);
    ``oldest_pending_age`` answers ``age``.  Settlements go through the lease.  Subclass it
    to change the capabilities (``name``, ``tells_age``, ``receive_ahead`` ...)."""

    name = "fake"
    queue = "default"  # the queue its leases name (Lease.queue)
    lost_lease_return_delay = 5.0

    def __init__(self, items: Iterable[str] = (), *, depth: int | None = None,
                 age: float | None = None) -> None:
        self.items = list(items)
        self.depth = depth
        self.age = age
        self.fail = False
        self.calls: list[int] = []
        self.threads: list[str] = []
        self.closed = False

    def receive(self, max_messages: int, lock_duration: float) -> list[FakeLease]:
        self.calls.append(max_messages)
        taken, self.items = self.items[:max_messages], self.items[max_messages:]
        return [FakeLease(message_id=x, queue=self.queue) for x in taken]

    def size(self) -> int:
        self.threads.append(threading.current_thread().name)
        if self.fail:
            raise BackendError("queue unreachable")
        return len(self.items) if self.depth is None else self.depth

    def oldest_pending_age(self, now: float) -> float | None:
        return self.age

    def close(self) -> None:
        self.closed = True
