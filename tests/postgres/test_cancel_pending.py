"""Issue 29: ``jobq-ctl cancel`` of a pending or delayed task on PostgreSQL does what it does
on SQLite -- the task is taken off the queue at once (failed, reason "cancelled by ...
(before it started)"), no worker can receive it, ``status`` counts it and ``result`` shows
it cancelled -- while a running task's cancel is only recorded for its worker.  Real jobq-ctl
processes on the session's server (``pg``); the queue is received in-process, as a worker
would (tests/postgres/queue.py)."""

from __future__ import annotations

import getpass
import json
import socket

from supervisor.fleet.control.open import open_control_store
from tests.integration.helpers import one_error_line
from tests.postgres.env import PgEnv
from tests.postgres.queue import open_queue

WHO = f"{getpass.getuser()}@{socket.gethostname()}"


def test_cancel_of_a_pending_and_a_delayed_task_takes_them_off_the_queue(pg: PgEnv) -> None:
    pg.serve()
    pending, running = pg.push("echo never", "sleep 100")
    [delayed] = pg.push("echo never later", extra=("--delay", "1h"))
    with pg.lease_of(running):
        res = pg.ctl("cancel", pending, delayed, running, "--reason", "wrong input")
    out = res.stdout.splitlines()
    assert f"{pending}: cancelled (it was pending and will not run)" in out, res.stdout
    assert f"{delayed}: cancelled (it was pending and will not run)" in out, res.stdout
    assert any(line.startswith(f"{running}: cancel recorded; its worker stops it")
               for line in out), res.stdout
    for task_id in (pending, delayed):
        job = pg.job(task_id)
        assert job["state"] == "failed" and job["ended_at"] is not None
        # worded as a worker words a cancel it finds at claim time
        assert job["reason"].startswith(f"cancelled by {WHO} at ")
        assert job["reason"].endswith(": wrong input (before it started)")
    assert pg.state(running) == "running"  # its worker acts on the record, not jobq-ctl
    # no worker can receive them any more
    backend = open_queue(pg.url, pg.queue, "another-worker")
    try:
        assert backend.receive(10, 60.0) == []
    finally:
        backend.close()
    counts = json.loads(pg.ctl("status", "--json").stdout)["counts"]
    assert (counts["pending"], counts["running"], counts["failed"]) == (0, 1, 2), counts
    [end] = json.loads(pg.ctl("result", pending, "--json").stdout)
    assert (end["state"], end["final"], end["cancelled_by"]) == ("cancelled", True, WHO), end
    assert end["reason"].endswith(": wrong input (before it started)")


def test_cancel_of_an_id_the_queue_does_not_hold_records_nothing(pg: PgEnv) -> None:
    """As on SQLite: the queue knows its ids, so an unknown one (any shape: a hand-written
    body's id is one the queue can hold) is one line, exit 1, and nothing is recorded."""
    pg.serve()
    [task_id] = pg.push("echo stays")
    line = one_error_line(pg.ctl("cancel", task_id, "job-17", check=False), 1)
    assert "no task 'job-17'" in line and "nothing cancelled" in line
    store = open_control_store(pg.settings())
    assert store is not None
    try:
        assert store.cancels(pg.queue) == []
    finally:
        store.close()
    assert pg.state(task_id) == "pending"
