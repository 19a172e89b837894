"""Issue 25 class 5, the pure part: the end of a task cancelled before it ran, derived from its
cancel record (task_ends.pending_cancel); the failed listing that ``jobq-ctl failed --json``
and the dashboard's ``/api/failed`` share (task_ends.failed_rows); an attempt superseded by a
later one is never shown running (ctl_result.shown_state); peek's time of a task
(backends.common.held_until).  Injected times, no processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from supervisor.backends.base import FailedRecord
from supervisor.backends.common import held_until
from supervisor.core.task import Task
from supervisor.fleet.control.records import Cancel, ResultRecord
from supervisor.ops.results import shown_state
from supervisor.ops.task_ends import SETTLE, failed_rows, final_records, pending_cancel

Q = "jobs"
NOW = 2.0e9


def rec(attempt: int, outcome: str, final: bool = False, worker: str = "vm1:1:aa",
        tail: str = "", by: str = "") -> ResultRecord:
    return ResultRecord(queue=Q, task_id="t", attempt=attempt, outcome=outcome, reason="",
                        tail=tail, exit_status=None if outcome == "running" else 1,
                        worker=worker, when=NOW - 100 + attempt, started=NOW - 100,
                        finished=None if outcome == "running" else NOW - 99, final=final,
                        cancelled_by=by)


CANCEL = Cancel(queue=Q, task_id="t", reason="wrong input", who="ann@box", when=NOW - 30)


def test_a_pending_task_cancelled_on_sqlite_ends_cancelled_at_once() -> None:
    end = pending_cancel(Q, [], CANCEL, "failed", NOW)
    assert end is not None
    assert (end.attempt, end.outcome, end.final, end.worker, end.cancelled_by) == (
        1, "cancelled", True, "", "ann@box")
    assert end.reason == ("cancelled by ann@box at 2033-05-18T03:32:50Z: wrong input "
                          "(before it started)")
    # cancelled while backing off after a failed attempt: the attempt that did not run
    end = pending_cancel(Q, [rec(1, "failed")], CANCEL, "failed", NOW)
    assert end is not None and end.attempt == 2
    # a requeued attempt runs again under its own number
    end = pending_cancel(Q, [rec(1, "requeued")], CANCEL, "failed", NOW)
    assert end is not None and end.attempt == 1


@pytest.mark.parametrize("records,job,why", [
    ([], "pending", "the cancel came first; its worker or cancel_pending acts next"),
    ([], "running", "a worker claimed it: it writes the end"),
    ([], None, "the row is gone"),
    ([rec(1, "running")], "failed", "an attempt runs: its worker writes the end"),
    ([rec(1, "succeeded", final=True)], "failed", "it ended before the cancel"),
    ([rec(1, "cancelled", final=True)], "failed", "its worker recorded the cancel"),
])
def test_no_end_is_derived_while_someone_else_writes_it(records, job, why) -> None:
    assert pending_cancel(Q, records, CANCEL, job, NOW) is None, why


def test_where_the_queue_cannot_tell_the_cancel_must_settle_first() -> None:
    young = replace(CANCEL, when=NOW - SETTLE + 1)
    assert pending_cancel(Q, [], young, "?", NOW) is None
    assert pending_cancel(Q, [], young, "?", NOW + 1) is not None
    expired = replace(CANCEL, ttl=10.0)
    assert pending_cancel(Q, [], expired, "?", NOW) is None
    assert pending_cancel(Q, [], None, "failed", NOW) is None


def test_failed_rows_take_only_the_record_that_ended_the_task() -> None:
    """Cancelled while backing off after attempt 1 failed: attempt 1's worker and output are
    not the cancel's; a task cancelled while it ran has its worker's record."""
    backing_off = FailedRecord(id="t", attempts=1, reason="cancelled by ann@box at X: why "
                               "(before it started)", command="sleep 1", failed_at=NOW)
    ran = FailedRecord(id="r", attempts=1, reason="cancelled by bob@box at X: no",
                       command="sleep 2", failed_at=NOW)
    plain = FailedRecord(id="f", attempts=3, reason="exit status 3", command="false",
                         failed_at=NOW, output_tail="oops\n")
    results = [rec(1, "failed", worker="w1", tail="attempt 1 output"),
               replace(rec(1, "cancelled", final=True, worker="w2", tail="bye", by="bob@box"),
                       task_id="r"),
               replace(rec(3, "failed", final=True, worker="w3"), task_id="f")]
    finals = final_records(results)
    assert set(finals) == {"r", "f"}
    rows = {r["id"]: r for r in failed_rows([backing_off, ran, plain], finals,
                                            {"t": CANCEL})}
    assert rows["t"] == {"id": "t", "state": "cancelled", "attempts": 1,
                         "reason": backing_off.reason, "command": "sleep 1",
                         "exit_status": None, "worker": None, "failed_at": NOW,
                         "cancelled_by": "ann@box", "output_tail": "", "signal": None}
    assert (rows["r"]["state"], rows["r"]["worker"], rows["r"]["cancelled_by"],
            rows["r"]["output_tail"]) == ("cancelled", "w2", "bob@box", "bye")
    assert (rows["f"]["state"], rows["f"]["worker"], rows["f"]["output_tail"],
            rows["f"]["cancelled_by"]) == ("failed", "w3", "oops\n", None)


def test_an_attempt_superseded_by_a_later_one_is_not_running() -> None:
    """Its worker's id may be live again (a restarted worker with a fixed --worker-id) or not
    known yet (killed before its first heartbeat): a later attempt settles it."""
    running = replace(rec(1, "running", worker="vm-01"), when=NOW - 1)
    live = {"vm-01": "running"}
    assert shown_state(running, live, NOW) == "running"
    assert shown_state(running, live, NOW, superseded=True) == "worker-lost"
    assert shown_state(running, {}, NOW) == "running"  # young, no worker record yet
    assert shown_state(running, {}, NOW, superseded=True) == "worker-lost"
    assert shown_state(rec(1, "failed"), live, NOW, superseded=True) == "failed"


def test_peek_shows_the_time_the_queue_holds_a_task_not_its_body() -> None:
    delayed = Task(cmd="true", not_before=NOW + 3600)
    assert held_until(delayed, NOW - 5, NOW).not_before is None  # requeued: ready  # type: ignore[union-attr]
    assert held_until(delayed, NOW + 3600, NOW).not_before == NOW + 3600  # type: ignore[union-attr]
    backing_off = held_until(Task(cmd="true"), NOW + 30, NOW)
    assert backing_off.not_before == NOW + 30  # type: ignore[union-attr]
    assert held_until("not a task", NOW + 30, NOW) == "not a task"
