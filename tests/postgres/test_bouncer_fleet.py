"""The fleet layer through PgBouncer in transaction mode with ``--postgres-notify off``
(``pgb`` fixture: tests/postgres/bouncer.py): ``jobq-ctl cancel`` reaches a running task and
``jobq-ctl logs`` reads its output, at the polling bounds (no LISTEN through the pooler)."""

from __future__ import annotations

import signal

import pytest

from supervisor.fleet.output.base import AttemptKey
from supervisor.fleet.output.postgres import PostgresOutputStore
from tests.conftest import wait_for
from tests.outstore.conftest import read_all
from tests.postgres.env import PgEnv

pytestmark = pytest.mark.timeout(120)

POLL = "0.2"


def test_cancel_through_the_bouncer(pgb: PgEnv) -> None:
    started = pgb.tmp / "started"
    pgb.serve()
    [tid] = pgb.push(f"touch {started}; exec sleep 60")
    sup = pgb.supervisor("-n", "1", "--poll-interval", POLL)
    wait_for(started.exists, 60, what=f"the task to start\n{sup.log()}")
    pgb.ctl("cancel", tid, "--reason", "through the pooler")
    sup.wait_log("cancelled: sending SIGTERM", 30)
    wait_for(lambda: pgb.job(tid)["state"] not in ("running", "pending"), 30,
             what=f"the cancelled task to end\n{sup.log()}")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()
    assert "_pg3_" not in sup.log(), sup.log()


def test_output_and_logs_through_the_bouncer(pgb: PgEnv) -> None:
    """A worker stores its task's output through the bouncer; ``jobq-ctl logs`` (which also
    reads the control store's result records) reads it back."""
    pgb.serve()
    [tid] = pgb.push("for i in 1 2 3 4 5; do echo line-$i; done")
    sup = pgb.supervisor("-n", "1", "--exit-when-empty", "--poll-interval", POLL)
    assert sup.wait(60) == 0, sup.log()
    assert "_pg3_" not in sup.log(), sup.log()
    lines = "".join(f"line-{i}\n" for i in range(1, 6))
    store = PostgresOutputStore(pgb.url, "jobq", create=False, prepare=False,
                                                notify=False)
    try:
        assert read_all(store, AttemptKey("default", tid, 1)) == (lines.encode(), True)
    finally:
        store.close()
    assert pgb.ctl("logs", tid).stdout == lines
    assert pgb.ctl("logs", "--tail", "2", tid).stdout == "line-4\nline-5\n"
