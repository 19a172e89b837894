"""Result records of attempts: what settlement decides -> the record the control thread
writes (results.py), and how the control thread batches them (control/outbox.py, agent.py).

Settlement is driven as in test_settlement.py (fake clock, fake lease); the sink is a list.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from typing import Any

import pytest
from test_control_agent import agent_for
from test_settlement import T0, WALL0, FakeBackend, Harness, settled

from supervisor.backends.base import BackendError, LeaseLost
from supervisor.core.task import Task
from supervisor.fleet.agent import LOG_EVERY
from supervisor.fleet.control import Cancel, ControlStoreError, ResultRecord
from supervisor.fleet.outbox import Outbox
from supervisor.worker.keeper import LeaseKeeper
from supervisor.worker.result_log import TAIL_CHARS, exit_parts
from tests.conftest import wait_for
from tests.fakes.clock import FakeClock
from tests.fakes.lease import FakeLease

pytestmark = pytest.mark.timeout(30)

RUN = 7.0  # each task ran this long (fake clock)


class Recorded(Harness):
    """A Harness whose result records go to ``seen``."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.seen: list[ResultRecord] = []
        self.settlement.results.sink = self.seen.append

    def end(self, rc: int, **kwargs: Any) -> ResultRecord:
        """Start a task at the current time, let it run RUN seconds and conclude it: its
        one end record."""
        rt = self.finished(rc, **kwargs)
        self.clock.now += RUN
        before = len(self.seen)
        self.settlement.conclude(rt, self.clock.now, stopping=kwargs.get("stopping", False))
        settled(rt.keeper)
        (record,) = self.seen[before:]
        return record


def fields(r: ResultRecord) -> tuple:
    return (r.outcome, r.final, r.exit_status, r.signal, r.max_attempts)


def test_exit_parts() -> None:
    assert exit_parts(0) == (0, None) and exit_parts(137) == (137, None)
    assert exit_parts(-9) == (None, 9) and exit_parts(None) == (None, None)


def test_a_start_record_says_running_with_its_wall_clock_start() -> None:
    h = Recorded()
    h.clock.now = T0 + 3
    h.settlement.results.started("t1", 2, 3, T0 + 1)
    (r,) = h.seen
    assert (r.task_id, r.attempt, r.outcome, r.final) == ("t1", 2, "running", False)
    assert r.worker == h.settlement.s.worker_id
    assert (r.started, r.finished, r.when, r.max_attempts) == (WALL0 + 1, None, WALL0 + 3, 3)


def test_success_is_final_with_status_times_and_no_tail() -> None:
    h = Recorded()
    r = h.end(0, output="lots of output\n" * 100)
    assert fields(r) == ("succeeded", True, 0, None, 3)
    assert (r.started, r.finished, r.tail) == (WALL0, WALL0 + RUN, "")


def test_a_failure_before_the_last_attempt_is_not_final_the_last_one_is() -> None:
    h = Recorded()
    first = h.end(3, attempt=1, output="x" * (TAIL_CHARS + 10))
    assert fields(first) == ("failed", False, 3, None, 3)
    assert first.tail == "x" * TAIL_CHARS and "retried in 10s" in first.reason
    last = h.end(3, attempt=3)
    assert fields(last) == ("failed", True, 3, None, 3)
    assert last.reason.endswith("attempt 3 of 3, giving up")


def test_a_final_record_names_the_unique_key_its_claim_is_released_by() -> None:
    """control/unique.py: the control thread releases the key after it writes this."""
    h = Recorded()
    task = Task(cmd="true", unique_key="nightly")
    assert h.end(3, attempt=1, task=task).unique_key is None  # retried: still held
    assert h.end(0, attempt=2, task=task).unique_key == "nightly"
    assert h.end(0, task=Task(cmd="true")).unique_key is None


def test_a_task_killed_by_a_signal_has_no_exit_status() -> None:
    r = Recorded().end(-signal.SIGKILL, attempt=3)
    assert fields(r) == ("failed", True, None, 9, 3)


def test_the_task_time_limit_is_a_failure() -> None:
    r = Recorded().end(-signal.SIGTERM, term_reason="time limit")
    assert fields(r) == ("failed", False, None, 15, 3) and "time limit" in r.reason


def test_a_cancelled_task_names_who_cancelled_it_and_is_final() -> None:
    cancel = Cancel(queue="q", task_id="t1", reason="wrong input", who="alice@ops", when=1e9)
    r = Recorded().end(-signal.SIGTERM, cancel=cancel, cancel_handled=True,
                       term_reason="cancelled", output="tail\n")
    assert fields(r) == ("cancelled", True, None, 15, 3)
    assert (r.cancelled_by, r.tail) == ("alice@ops", "tail\n")
    assert "wrong input" in r.reason


@pytest.mark.parametrize("how", ["preempted", "stopping"])
def test_a_preempted_task_is_requeued_not_final(how: str) -> None:
    h = Recorded()
    if how == "preempted":
        r = h.end(-signal.SIGTERM, stop_reason="preempted")
    else:  # the worker stops: a SIGTERM'd shell goes back to the queue
        r = h.end(128 + signal.SIGTERM, stopping=True)
    assert r.outcome == "requeued" and not r.final and r.tail == ""
    assert (r.exit_status, r.signal) == ((None, 15) if how == "preempted" else (143, None))


def test_a_lost_lock_is_recorded_as_lock_lost() -> None:
    r = Recorded().end(-signal.SIGKILL, lock_loss_handled=True)
    assert fields(r) == ("lock-lost", False, None, 9, 3)


def test_a_refused_settlement_is_corrected_to_lock_lost_under_the_same_key() -> None:
    h = Recorded()
    rt = h.finished(0, attempt=2)
    rt.keeper.lease.refuse = LeaseLost("lock expired")
    h.clock.now += RUN
    h.settlement.conclude(rt, h.clock.now, stopping=False)
    settled(rt.keeper)
    assert [fields(r) for r in h.seen] == [("succeeded", True, 0, None, 3)]
    h.clock.now += 1
    h.settlement.prune()
    h.settlement.prune()  # corrected once
    claimed, corrected = h.seen
    assert (corrected.task_id, corrected.attempt) == (claimed.task_id, claimed.attempt)
    assert fields(corrected) == ("lock-lost", False, 0, None, 3)
    assert "refused" in corrected.reason and corrected.when == WALL0 + RUN + 1


def test_a_settlement_the_outage_outlasted_says_unreachable_not_refused() -> None:
    """Issue 26: nothing refused it -- the service could not be reached until the lease
    ended.  The corrected record says that, and what was decided (succeeded, exit 0)."""
    h = Recorded()
    rt = h.finished(0)
    rt.keeper.lease.refuse = BackendError("connection timed out")
    h.clock.now += RUN
    h.settlement.conclude(rt, h.clock.now, stopping=False)
    wait_for(lambda: rt.keeper.lease.calls, 10, what="a first settlement try")
    h.clock.now = rt.keeper.deadline + 1  # the outage outlasts the lease
    rt.keeper._wake.put(None)  # the keeper's retry wait ends now, not in a second
    settled(rt.keeper)
    h.settlement.prune()
    claimed, corrected = h.seen
    assert fields(corrected) == ("lock-lost", False, 0, None, 3)
    assert corrected.reason.startswith(
        "succeeded, then could not settle: the service was unreachable until the lease ended")
    assert "refused" not in corrected.reason
    assert "the task runs again" in corrected.reason


def test_an_accepted_settlement_is_not_corrected() -> None:
    h = Recorded()
    h.end(1)
    h.settlement.prune()
    assert [r.outcome for r in h.seen] == ["failed"]


class QuickBackend(FakeBackend):
    quick_settle = True

    def quick_writes(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def test_a_refusal_on_the_quick_path_is_corrected_too() -> None:
    h = Recorded()
    h.settlement.backend = QuickBackend()
    h.settlement.quick_settle = True
    rt = h.finished(0)
    rt.keeper.lease.refuse = LeaseLost("gone")
    h.settlement.conclude(rt, h.clock.now, stopping=False)
    assert rt.keeper.done.is_set()  # settled (refused) right here, without a thread
    h.settlement.prune()
    assert [r.outcome for r in h.seen] == ["succeeded", "lock-lost"]


def test_attempts_exhausted_before_a_run_is_a_final_failure() -> None:
    h = Recorded()
    task = Task(cmd="true")
    lease = FakeLease(task=task, attempt=4)
    keeper = LeaseKeeper(lease, task.id, t_sent=h.clock.now, granted=60.0, renew_interval=20.0,
                         clock=h.clock)
    assert h.settlement.reject(lease, keeper, task.id, 3)
    (r,) = h.seen
    assert (r.task_id, r.attempt, r.outcome, r.final, r.started) == (task.id, 4, "failed",
                                                                     True, None)


def test_a_message_that_must_not_run_writes_no_record() -> None:
    """An unsigned or unreadable message may name any task id: it must not write a result
    for a task it is not."""
    h = Recorded()
    lease = FakeLease(format_error="not JSON", raw_body="{")
    keeper = LeaseKeeper(lease, "msg-1", t_sent=h.clock.now, granted=60.0, renew_interval=20.0,
                         clock=h.clock)
    assert h.settlement.reject(lease, keeper, "msg-1", 3)
    assert h.seen == []


def test_without_a_sink_no_record_is_built() -> None:
    h = Harness()
    assert h.settlement.results.ended("t1", 1, "succeeded", max_attempts=1) is None
    assert h.conclude(0) == [("complete",)]


# ---------------------------------------------------------------------- outbox and agent
def record(task: str = "t1", attempt: int = 1, outcome: str = "running") -> ResultRecord:
    return ResultRecord(queue="q", task_id=task, attempt=attempt, outcome=outcome, reason="",
                        tail="", exit_status=None, worker="w1", when=1e9)


def test_outbox_keeps_the_newest_record_of_an_attempt_and_drops_the_oldest() -> None:
    clock = FakeClock(T0)
    box = Outbox(clock, kept=3, delay=0.5)
    assert box.due() == float("inf")
    assert box.put(record("a")) is True  # the first: wake the thread
    assert box.put(record("a", outcome="succeeded")) is False
    assert box.due() == T0 + 0.5 and len(box) == 1
    for t in "bcd":
        box.put(record(t))
    assert box.dropped == 1 and [k for k, _ in box.batch()] == ["b", "c", "d"]
    assert [r.outcome for r in box.batch().values()] == ["running"] * 3


def test_a_record_replaced_during_a_write_waits_for_the_next_one() -> None:
    clock = FakeClock(T0)
    box = Outbox(clock)
    box.put(record("a"))
    box.put(record("b"))
    batch = box.batch()
    newer = record("a", outcome="failed")
    box.put(newer)  # while the batch is being written
    clock.now = T0 + 2
    box.written(batch)
    assert list(box.batch().values()) == [newer] and box.due() == T0 + 2.5


class Recording:
    """A store that records the batches it was given; ``down``: fails them."""

    name = "rec"

    def __init__(self) -> None:
        self.batches: list[list[ResultRecord]] = []
        self.down = False

    def put_results(self, batch: list[ResultRecord]) -> None:
        if self.down:
            raise ControlStoreError("black-holed")
        self.batches.append(list(batch))


def test_agent_writes_what_waits_in_one_call_once_it_is_due() -> None:
    clock = FakeClock(T0)
    store = Recording()
    agent, _, _ = agent_for(store, clock)
    for i in range(300):
        agent.result(record(f"t{i}"))
        agent.result(record(f"t{i}", outcome="succeeded"))
    assert agent.outbox.due() == T0 + 0.5
    agent._write_results()
    (batch,) = store.batches
    assert len(batch) == 300 and {r.outcome for r in batch} == {"succeeded"}
    assert len(agent.outbox) == 0 and agent.outbox.due() == float("inf")


def test_a_failed_write_keeps_the_records_for_after_the_back_off(caplog) -> None:
    clock = FakeClock(T0)
    store = Recording()
    agent, _, _ = agent_for(store, clock)
    agent.outbox.kept = 10
    store.down = True
    for i in range(15):
        agent.result(record(f"t{i}"))
    with pytest.raises(ControlStoreError):
        agent._write_results()
    assert len(agent.outbox) == 10 and agent.outbox.dropped == 5
    with caplog.at_level(logging.WARNING, "jobq.control"):
        agent.outbox.report_drops(LOG_EVERY)
        agent.result(record("late"))  # one more dropped: not logged again within a minute
        agent.outbox.report_drops(LOG_EVERY)
        clock.now += LOG_EVERY
        agent.outbox.report_drops(LOG_EVERY)
    drops = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(drops) == 2 and drops[0].startswith("control store: 5 result record(s)")
    store.down = False
    agent._write_results()
    assert len(store.batches[0]) == 10 and len(agent.outbox) == 0


def test_the_control_thread_writes_results_batched(tmp_path) -> None:
    """The real thread on a real SQLite store: queued records are written within about
    RESULT_DELAY, the two records of an attempt as one."""
    import time

    from supervisor.fleet.control.sqlite import SqliteControlStore

    store = SqliteControlStore(str(tmp_path / "q.db"))
    agent, _, _ = agent_for(store, FakeClock(T0))
    agent.clock = agent.outbox.clock = time.monotonic
    agent.start()
    try:
        assert agent.wait_first_poll(10)
        for i in range(5):
            agent.result(record(f"t{i}"))
            agent.result(record(f"t{i}", outcome="succeeded"))
        reader = SqliteControlStore(str(tmp_path / "q.db"))
        deadline = time.monotonic() + 10
        while len(reader.results("q")) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [r.outcome for r in reader.results("q")] == ["succeeded"] * 5
        reader.close()
    finally:
        agent.stop(clean=False)
