"""Every Backend behind one fixture, for the contract suite (test_contract.py).

One fixture per implementation makes a ``Kit``: SQLite on a real file in tmp_path, Storage
Queue on the session's Azurite, Service Bus on the in-process AMQP test broker.  The ``kit``
fixture is parametrized over them (the Azure ones carry the ``azure`` / ``servicebus``
markers); adding a backend is adding one fixture here and its name to ``KITS``.

What the Backend protocol has a flag for (``priorities``, ``max_delay``, ``no_retry_delay``
...) the tests read from the backend itself.  What it has none for, but the backends document
differently, each kit declares (``Traits``), so that the suite states the difference instead
of skipping over it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from supervisor.backends.base import Backend
from tests.fakes.clock import FakeClock
from tests.servicebus.conftest import (  # sb_broker: imported to be a fixture here too
    close_backend,
    sb_broker,  # noqa: F401
    work_backend,
)

LOCK = 30.0  # s: the lock of a lease a test holds for a moment (never lapses within a test)
WORKER = "w1"
REAPER_INTERVAL = 300.0  # SQLite: s of the injected clock between two stale-lock reaper passes


@dataclass(frozen=True)
class Traits:
    """Documented differences the protocol has no flag for."""

    # ``peek`` lists tasks held back (not_before, a retry's delay) with their time; Storage
    # Queue peeks only the visible messages.
    peek_shows_held: bool
    # ``size`` (and the waiting count of ``status``) counts messages a lease holds: the Azure
    # services count held messages with the waiting ones.
    size_counts_leased: bool
    # ``clear(failed=False)`` deletes leased messages too (Storage Queue cannot tell them).
    clear_takes_leased: bool
    # ``status().running`` lists the leased tasks (SQLite keeps who holds what).
    lists_running: bool
    # ``Lease.message_id`` is the task id (SQLite; Service Bus sends it as message id);
    # Storage Queue's is the service's own message id.
    message_id_is_task_id: bool


@dataclass
class Kit:
    """A backend under test, and what a test needs beside the Backend protocol."""

    name: str
    # make(queue=None, lock=LOCK, worker=WORKER): a backend on queue ``queue`` (None: the
    # kit's queue) of the same storage, closed when the test ends.  ``lock`` is the queue's
    # lock where the service fixes it per queue (Service Bus: the same for every backend of
    # one queue); elsewhere the lock is what ``receive`` asks.
    make: Callable[..., Backend]
    traits: Traits
    # Ends the locks held right now where the service can be told to (the test broker);
    # elsewhere a lease taken with a short lock lapses by itself.
    lapse: Callable[[], None]
    clock: FakeClock | None = None  # the injected clock, where the backend takes one
    # Contract breaches found and not fixed yet: the test named by the key is expected to
    # fail (strict: once fixed, it passes and says so), the value says what is wrong.
    bugs: dict[str, str] = field(default_factory=dict)
    # The service's name of the queue ``make(queue=q)`` opens: what its leases' ``queue`` says
    # (a worker keys its several queues by these names).
    queue_named: Callable[[str], str] = lambda q: q
    _first: Backend | None = None

    @property
    def backend(self) -> Backend:
        """The kit's own backend on its queue (made at the first use)."""
        if self._first is None:
            self._first = self.make()
        return self._first

    def known_bug(self, request: pytest.FixtureRequest, key: str) -> None:
        """Mark the running test as failing for a known bug of this backend, if it has one."""
        if key in self.bugs:
            request.applymarker(pytest.mark.xfail(strict=True, reason=self.bugs[key]))

    def turn(self, backend: Backend) -> None:
        """One idle turn of a worker's main loop on ``backend``: the injected clock moves on
        by the backend's ``lost_lease_return_delay`` (the time a lost lease needs to come
        back), then ``maintenance`` runs."""
        if self.clock is not None:
            self.clock.now += backend.lost_lease_return_delay
        backend.maintenance()


@pytest.fixture
def sqlite_kit(tmp_path: Path, close_at_end) -> Kit:
    """SQLite on a real file.  The reaper takes back a lock the moment it lapsed
    (``stale_lock_age=0``), on the injected clock's schedule."""
    from supervisor.backends.sqlite.backend import SqliteBackend

    path = str(tmp_path / "queue.db")
    clock = FakeClock(1000.0)

    def make(queue: str | None = None, lock: float = LOCK, worker: str = WORKER) -> Backend:
        backend = close_at_end(SqliteBackend(path, queue or "jobs", worker, stale_lock_age=0.0,
                                             reaper_interval=REAPER_INTERVAL))
        backend.clock = clock
        return backend

    return Kit("sqlite", make, Traits(peek_shows_held=True, size_counts_leased=False,
                                      clear_takes_leased=False, lists_running=True,
                                      message_id_is_task_id=True),
               lapse=lambda: None, clock=clock)


@pytest.fixture
def storage_queue_kit(azurite, queue_name: str, close_at_end) -> Kit:
    """Storage Queue on the session's Azurite, a fresh queue name per test."""
    from supervisor.backends.storage_queue.backend import StorageQueueBackend

    def make(queue: str | None = None, lock: float = LOCK, worker: str = WORKER) -> Backend:
        name = queue_name if queue is None else f"{queue_name}-{queue}"
        return close_at_end(StorageQueueBackend(name, connection_string=azurite.connection_string,
                                                worker_id=worker))

    return Kit("storage-queue", make, Traits(peek_shows_held=False, size_counts_leased=True,
                                             clear_takes_leased=True, lists_running=False,
                                             message_id_is_task_id=False),
               lapse=lambda: None, queue_named=lambda q: f"{queue_name}-{q}")


@pytest.fixture
def servicebus_kit(sb_broker) -> Iterator[Kit]:  # noqa: F811 (the imported fixture)
    """Service Bus on the test broker (a broker per test: its queues start empty)."""
    made: list[Backend] = []

    def make(queue: str | None = None, lock: float = LOCK, worker: str = WORKER) -> Backend:
        made.append(work_backend(sb_broker, receivers=1, queue=queue or "work", lock=lock,
                                 worker_id=worker))
        return made[-1]

    yield Kit("servicebus", make, Traits(peek_shows_held=True, size_counts_leased=True,
                                         clear_takes_leased=False, lists_running=False,
                                         message_id_is_task_id=True),
              lapse=sb_broker.expire_locks,
              bugs={"release-after-end": "ServiceBusLease.release(count_attempt=False) sends "
                    "the task's copy before it checks that the lease is over"})
    close_backend(*made)


@pytest.fixture
def postgres_kit(pg_url: str, close_at_end) -> Kit:
    """PostgreSQL on the session's real server, a fresh database per test.  A lapsed lease
    comes back through the backend's expired-lease pass (its ``maintenance``), as a worker's
    idle turn runs it."""
    from tests.postgres.queue import open_queue

    def make(queue: str | None = None, lock: float = LOCK, worker: str = WORKER) -> Backend:
        return close_at_end(open_queue(pg_url, queue or "jobs", worker))

    return Kit("postgres", make, Traits(peek_shows_held=True, size_counts_leased=False,
                                        clear_takes_leased=False, lists_running=True,
                                        message_id_is_task_id=True),
               lapse=lambda: None,
               bugs={"lapsed-lease-return": "no expired-lease pass in PostgresBackend.passes "
                     "yet: a lapsed lease stays running"})


KITS = ["sqlite_kit",
        pytest.param("postgres_kit", marks=pytest.mark.postgres),
        pytest.param("storage_queue_kit", marks=pytest.mark.azure),
        pytest.param("servicebus_kit", marks=pytest.mark.servicebus)]


@pytest.fixture(params=KITS, ids=lambda name: name.removesuffix("_kit"))
def kit(request) -> Kit:
    return request.getfixturevalue(request.param)


@pytest.fixture
def backend(kit: Kit) -> Backend:
    return kit.backend
