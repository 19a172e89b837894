"""The deadlines watcher thread (supervisor/backends/postgres/deadlines.py): it parks while no
call comes (no wake-ups at all), ends on its stop Event when the backend closes -- promptly,
leaving no thread of the backend behind -- and a later call starts another.  Every thread a
backend starts blocks the supervisor's signals (core/threads.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from supervisor.backends.postgres.deadlines import DEADLINES, CallDeadlines
from supervisor.core.task import Task
from supervisor.core.threads import HANDLED_SIGNALS
from tests.postgres.queue import open_queue
from tests.postgres.test_connect import _signals_blocked_in

pytestmark = pytest.mark.timeout(60)

WATCHER = "jobq-pg-deadlines"


def switches(thread: threading.Thread) -> int:
    """The thread's voluntary context switches so far: one per wait it blocked in."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def call(deadlines: CallDeadlines, conn: psycopg.Connection) -> None:
    """A quick call with a short bound (its deadline, 0.5 s on, is one the watcher may wake
    at: the windows looked at below come after it)."""
    with deadlines.within(time.monotonic() + 0.5), deadlines.bounded(conn):
        conn.execute("SELECT 1")


def test_an_idle_watcher_parks_and_the_next_call_wakes_it(pg_url: str) -> None:
    deadlines = CallDeadlines()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        call(deadlines, conn)
        watcher = deadlines.watcher
        assert watcher is not None and watcher.is_alive()
        # Parked: a whole second without a single wake-up, soon after the last call's
        # deadline (a watcher that looks every TICK while idle never has one).
        deadline = time.monotonic() + 10
        while True:
            before = switches(watcher)
            time.sleep(1.0)  # the window looked at: nothing to wait for but time
            if switches(watcher) == before:
                break
            assert time.monotonic() < deadline, "the idle watcher keeps waking up"
        # The next call wakes it: a call past its deadline is still cut.
        backend_pid = conn.info.backend_pid
        with psycopg.connect(pg_url, autocommit=True) as other:
            t0 = time.monotonic()
            with pytest.raises(psycopg.OperationalError, match="no answer"), \
                    deadlines.within(time.monotonic() + 0.5), deadlines.bounded(conn):
                conn.execute("SELECT pg_sleep(30)")  # held past its deadline on the server
            took = time.monotonic() - t0
            other.execute("SELECT pg_terminate_backend(%s)", (backend_pid,))
        assert took < 10, f"the cut came {took:.1f}s into the call"
        assert deadlines.watcher is watcher  # the same thread, woken
    deadlines.stop()
    assert not watcher.is_alive()
    assert deadlines.watcher is None


def test_closing_the_backend_ends_the_watcher_promptly_and_leaves_no_thread(
        pg_url: str) -> None:
    # the watcher is one per process: one an earlier test's backend left running in this
    # pytest worker is ended first, so that this backend's is the new one
    DEADLINES.stop()
    before = {t.ident for t in threading.enumerate() if t.is_alive()}
    backend = open_queue(pg_url, poll_interval=1.0)
    try:
        backend.push([Task(cmd="true")])
        (lease,) = backend.receive(1, 30.0)  # a bounded main-thread call
        lease.renew(5.0)  # and a lease thread's (here: the test's)
        lease.complete()
        # every thread of the backend (ours and the pools') takes none of our signals
        new = {t.name for t in threading.enumerate() if t.ident not in before}
        assert WATCHER in new and "pg-wake-listener" in new
        for name in new:
            assert set(HANDLED_SIGNALS) <= _signals_blocked_in(name), name
    finally:
        t0 = time.monotonic()
        backend.close()
        took = time.monotonic() - t0
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not left, f"threads left after close: {left}"
    assert took < 5.0, f"close took {took:.2f}s"  # the old watcher idled 60 s
    # a later backend's call starts another watcher
    backend = open_queue(pg_url, poll_interval=1.0)
    try:
        backend.receive(1, 30.0)
        assert any(t.name == WATCHER and t.is_alive() for t in threading.enumerate())
    finally:
        backend.close()
    assert not any(t.name == WATCHER and t.is_alive() for t in threading.enumerate())
