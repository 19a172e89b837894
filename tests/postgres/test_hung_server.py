"""A server that hangs (SIGSTOP of the postmaster and its backends: the kernel still accepts and
acknowledges, nothing answers, so neither does a statement_timeout): a lease's renewal and
settlement still give up within the time they were given (base.Lease.renew: "must give up
within timeout seconds"), and the lease works again once the server does."""

from __future__ import annotations

import time

import pytest

from supervisor.backends.base import BackendError
from supervisor.core.task import Task
from tests.postgres.faults import frozen
from tests.postgres.queue import open_queue

# timing: times the give-up of calls to a hung server
pytestmark = [pytest.mark.timing, pytest.mark.timeout(120)]

GRACE = 1.0  # s: the call's own time, plus a busy machine's


def test_a_renewal_gives_up_in_time_on_a_frozen_server(pg_server, pg_url, close_at_end):
    backend = close_at_end(open_queue(pg_url))
    task = Task(cmd="true")
    backend.push([task])
    (lease,) = backend.receive(1, 30.0)
    assert lease.renew(5.0) > 25.0  # the lease pool has a live connection
    with frozen(pg_server):
        for timeout in (1.5, 0.5):  # a connection that hung, then a fresh try
            t0 = time.monotonic()
            with pytest.raises(BackendError) as err:
                lease.renew(timeout)
            took = time.monotonic() - t0
            print(f"renew({timeout}) gave up after {took:.2f}s: {err.value}")
            assert took < timeout + GRACE, f"renew({timeout}) took {took:.1f}s"
            assert "Traceback" not in str(err.value) and "\n" not in str(err.value)
    assert lease.renew(5.0) > 25.0  # the pool replaced what was cut
    lease.complete()
