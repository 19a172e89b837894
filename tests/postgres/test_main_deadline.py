"""The worker's main-thread calls (receive, maintenance, push) against a hung server (SIGSTOP
of the postmaster and its backends: the kernel still acknowledges, nothing answers, no
statement_timeout fires) end within their bound with one BackendError line, and work again
once the server does (db.py ``main_bound``, deadlines.py).  The lease threads' side:
test_hung_server.py; a real worker through a freeze: test_frozen_worker.py."""

from __future__ import annotations

import time

import pytest

from supervisor.backends.base import BackendError
from supervisor.core.task import Task
from tests.postgres.faults import frozen
from tests.postgres.queue import open_queue

# timing: times the give-up of calls to a hung server
pytestmark = [pytest.mark.timing, pytest.mark.timeout(120)]

GRACE = 0.5  # s past the bound (the brief's "timeout + 0.5 s")


def test_a_main_thread_call_gives_up_within_its_bound_on_a_frozen_server(
        pg_server, pg_url, close_at_end):
    backend = close_at_end(open_queue(pg_url, poll_interval=1.0))
    assert backend.db.main_bound == 1.0  # one poll interval
    backend.push([Task(cmd="true")])
    with frozen(pg_server):
        # a connection that hangs (cut), then no live connection to be had (the pool's wait)
        for what, call in (("receive", lambda: backend.receive(1, 30.0)),
                           ("receive again", lambda: backend.receive(1, 30.0)),
                           ("push", lambda: backend.push([Task(cmd="true")]))):
            t0 = time.monotonic()
            with pytest.raises(BackendError) as err:
                call()
            took = time.monotonic() - t0
            print(f"{what} gave up after {took:.2f}s: {err.value}")
            assert took < 1.0 + GRACE, f"{what} took {took:.2f}s: {err.value}"
            assert "\n" not in str(err.value) and str(err.value).startswith("PostgreSQL: ")
        # maintenance logs its failures and tries again later (purger, reaper): per pass
        t0 = time.monotonic()
        backend.maintenance()
        took = time.monotonic() - t0
        assert took < len(backend.passes) * (1.0 + GRACE), f"maintenance took {took:.2f}s"
    # The server answers again: the pool replaced the cut connection.  (A cut receive or push
    # may still be carried out when the server thaws -- it had the statement -- so the rows
    # are not asserted: such a claim comes back through the expired-lease reaper.)
    deadline = time.monotonic() + 30
    while True:
        try:
            backend.push([Task(cmd="true")])
            leases = backend.receive(10, 30.0)
            break
        except BackendError:
            assert time.monotonic() < deadline, "no push and receive within 30 s of the thaw"
    assert leases
    for lease in leases:
        lease.complete()


def test_jobq_ctl_calls_are_not_bounded(pg_url, close_at_end):
    """An admin command may run long on a big table: only the worker's calls are bounded."""
    backend = close_at_end(open_queue(pg_url, for_ctl=True))
    assert backend.db.main_bound is None
