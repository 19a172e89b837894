"""A ``running`` result record whose worker died before writing the end is shown as
``worker-lost`` (ctl_result.shown_state): by ``jobq-ctl result`` here, on a real SQLite control
store with an injected wall clock."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from supervisor.ctl.result_command import cmd_result
from supervisor.fleet.control.base import LOST_AFTER
from supervisor.fleet.control.records import ResultRecord, WorkerRecord
from supervisor.fleet.control.sqlite import SqliteControlStore
from supervisor.ops import fleet as ops_fleet
from supervisor.ops.results import LOST_GRACE, shown_state

pytestmark = pytest.mark.timeout(30)

NOW = 1_800_000_000.0
Q = "q"


def running(worker: str, when: float, attempt: int = 1) -> ResultRecord:
    return ResultRecord(queue=Q, task_id="t1", attempt=attempt, outcome="running", reason="",
                        tail="", exit_status=None, worker=worker, when=when,
                        started=when - 1, max_attempts=3)


def worker(wid: str, heartbeat: float, interval: float = 1.0) -> WorkerRecord:
    return WorkerRecord(id=wid, queue=Q, host="h", pid=1, version="v", state="running",
                        slots_used=1, slots_total=1, started=heartbeat - 10,
                        heartbeat=heartbeat, interval=interval)


@pytest.mark.parametrize("workers, when, shown", [
    ({"w": "running"}, NOW - 3600, "running"),  # its worker heartbeats: it runs
    ({"w": "draining"}, NOW - 3600, "running"),
    ({"w": "lost"}, NOW - 1, "worker-lost"),  # stale heartbeat: at once
    ({}, NOW - LOST_GRACE - 1, "worker-lost"),  # no record (exited, purged)
    ({}, NOW - LOST_GRACE + 1, "running"),  # ... may not be written yet
    (None, NOW - 3600, "running"),  # workers not known: as stored
])
def test_shown_state(workers, when, shown) -> None:
    assert shown_state(running("w", when), workers, NOW) == shown


def test_only_running_records_are_ever_shown_otherwise() -> None:
    for outcome in ("succeeded", "failed", "cancelled", "lock-lost", "requeued"):
        r = ResultRecord(queue=Q, task_id="t1", attempt=1, outcome=outcome, reason="",
                         tail="", exit_status=0, worker="gone", when=0.0, started=0.0,
                         finished=1.0, max_attempts=3)
        assert shown_state(r, {}, NOW) == outcome


def test_jobq_ctl_result_shows_the_attempt_of_a_dead_worker_as_worker_lost(
        tmp_path, monkeypatch, capsys) -> None:
    store = SqliteControlStore(str(tmp_path / "q.db"))
    try:
        store.put_worker(worker("dead", NOW - LOST_AFTER * 1.0 - 1))  # 3 beats missed
        store.put_worker(worker("alive", NOW - 0.5))
        store.put_results([running("dead", NOW - 30, attempt=1),
                           running("alive", NOW - 5, attempt=2)])
        monkeypatch.setattr(ops_fleet, "clock", lambda: NOW)
        assert cmd_result(SimpleNamespace(queue=Q, id="t1", json=True), None, store) == 0
        got = json.loads(capsys.readouterr().out)
        assert [(a["attempt"], a["state"]) for a in got] == [(1, "worker-lost"), (2, "running")]
        assert got[0]["duration_s"] is None  # its end is not known
        assert got[1]["duration_s"] == 6.0
        assert cmd_result(SimpleNamespace(queue=Q, id="t1", json=False), None, store) == 0
        table = capsys.readouterr().out.splitlines()
        assert "worker-lost" in table[2] and "dead" in table[2], table
        assert "running" in table[3] and "alive" in table[3], table
    finally:
        store.close()


def test_jobq_ctl_result_says_a_task_that_ended_unsettled_ran_again(
        tmp_path, monkeypatch, capsys) -> None:
    """Issue 26: attempt 1 ran to its end (exit 0) but was not settled, and the task ran a
    second time: the table says why, and that it ran again."""
    store = SqliteControlStore(str(tmp_path / "q.db"))
    why = ("succeeded, then could not settle: the service was unreachable until the lease "
           "ended (timed out); the message comes back and the task runs again")
    try:
        store.put_worker(worker("w", NOW - 0.5))
        store.put_results([
            ResultRecord(queue=Q, task_id="t1", attempt=1, outcome="lock-lost", reason=why,
                         tail="", exit_status=0, worker="w", when=NOW - 20,
                         started=NOW - 30, finished=NOW - 26, max_attempts=3),
            ResultRecord(queue=Q, task_id="t1", attempt=2, outcome="succeeded", reason="",
                         tail="", exit_status=0, worker="w", when=NOW - 5, started=NOW - 9,
                         finished=NOW - 5, max_attempts=3, final=True)])
        monkeypatch.setattr(ops_fleet, "clock", lambda: NOW)
        assert cmd_result(SimpleNamespace(queue=Q, id="t1", json=False), None, store) == 0
        first, second = capsys.readouterr().out.splitlines()[2:]
        assert "lock-lost" in first and "exit 0" in first
        assert first.endswith(f"{why}; ran again as attempt 2"), first
        assert "ran again" not in second
    finally:
        store.close()
