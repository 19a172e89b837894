"""When the next receive may go (pacing.py): after a receive that left a slot empty, none
while tasks are starting or settling, for at most a poll interval.  A fake clock; nothing is
spawned (the spawner threads never start)."""

from __future__ import annotations

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.settings import Settings
from supervisor.core.task import Task
from supervisor.worker.loop import Worker
from supervisor.worker.pacing import ReceivePacing
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(30)


def test_a_dry_receive_holds_the_next_while_work_is_in_flight_for_a_poll_at_most() -> None:
    pacing = ReceivePacing(poll_interval=1.0)
    assert not pacing.holds(100.0, True)  # nothing ran dry yet
    pacing.ran_dry(100.0)
    assert pacing.holds(100.5, True)
    assert not pacing.holds(100.5, False)  # nothing starting or settling: receive
    assert not pacing.holds(101.0, True)  # a hung settlement holds it a poll, no longer
    pacing.ran_dry(102.0)
    pacing.filled(0.01)  # the queue has work again: no hold
    assert not pacing.holds(102.1, True)


class Counting(SqliteBackend):
    """Counts its own receives (a count on the class ran on from the test before it, which
    a shuffled order showed)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.calls = 0

    def receive(self, max_messages, lock_duration):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().receive(max_messages, lock_duration)


def test_the_worker_does_not_receive_after_a_dry_receive_while_a_task_is_starting(
        tmp_path) -> None:
    clock = FakeClock(1000.0)
    db = str(tmp_path / "q.db")
    backend = Counting(db, "default", "w")
    try:
        backend.push([Task(cmd="true", id="t0")])
        worker = Worker(Settings(sqlite_path=db, worker_id="w", poll_interval=1.0,
                                 num_workers=2), backend, clock=clock)
        worker.next_receive = clock.now
        worker._receive(clock.now)  # asks for 2, gets 1: dry; t0 is starting
        assert backend.calls == 1 and len(worker.launcher.starting) == 1
        backend.push([Task(cmd="true", id="t1")])
        worker.next_receive = clock.now  # as a reaped task would
        clock.now += 0.5
        worker._receive(clock.now)
        assert backend.calls == 1  # held: t0 is still starting
        clock.now += 0.6  # a poll after the dry receive: the hold is over
        worker._receive(clock.now)
        assert backend.calls == 2 and len(worker.launcher.starting) == 2
        worker.launcher.cancel_starting()
    finally:
        backend.close()


# ------------------------------------------------------------------------------ gathering
def test_gathering_waits_for_busy_slots_expected_to_end_within_half_a_receive() -> None:
    pacing = ReceivePacing(poll_interval=1.0)
    assert not pacing.gather(100.0, [100.001])  # no receive timed yet
    pacing.filled(0.02)  # receives take 20 ms: wait up to 10 ms
    assert not pacing.gather(100.0, [])  # nothing busy
    assert not pacing.gather(100.0, [100.011])  # would end after half a receive
    assert pacing.gather(100.0, [100.011, 100.004])
    assert pacing.gather_until == pytest.approx(100.01)
    assert pacing.gather(100.006, [100.004])  # late (ends are seen when reaped): waits on
    assert pacing.gather_until == pytest.approx(100.01)  # ... to the same bound
    assert not pacing.gather(100.007, [100.03])  # none expected soon any more: receive
    assert pacing.gather_until is None
    assert pacing.gather(100.02, [100.021])
    assert not pacing.gather(100.03, [100.021])  # the bound passed: receive now
    assert pacing.gather_until is None


def test_gathering_never_waits_longer_than_gather_max() -> None:
    from supervisor.worker.pacing import GATHER_MAX

    pacing = ReceivePacing(poll_interval=1.0)
    pacing.filled(10.0)  # a receive of a very slow link
    assert pacing.gather(100.0, [100.0 + GATHER_MAX])
    assert pacing.gather_until == pytest.approx(100.0 + GATHER_MAX)
    assert not pacing.gather(100.0 + GATHER_MAX, [100.0 + GATHER_MAX])


def test_receive_time_is_a_moving_average_of_receives_that_filled() -> None:
    pacing = ReceivePacing(poll_interval=1.0)
    pacing.filled(0.02)
    pacing.filled(0.07)
    assert pacing.receive_time == pytest.approx(0.8 * 0.02 + 0.2 * 0.07)


class NoAhead(Counting):
    receive_ahead = False  # as Service Bus: a receive takes only the free slots


@pytest.mark.parametrize("backend_cls, task_seconds, gathers", [
    (NoAhead, 0.004, True),
    (NoAhead, 5.0, False),  # long tasks: their slots free no time soon
    (Counting, 0.004, False),  # a backend that receives ahead does not gather
])
def test_the_worker_gathers_slots_of_short_tasks_before_it_receives(
        tmp_path, backend_cls, task_seconds, gathers) -> None:
    clock = FakeClock(1000.0)
    db = str(tmp_path / "q.db")
    backend = backend_cls(db, "default", "w")
    try:
        backend.push([Task(cmd="true", id="t0")])
        worker = Worker(Settings(sqlite_path=db, worker_id="w", poll_interval=1.0,
                                 num_workers=2), backend, clock=clock)
        worker.next_receive = clock.now
        worker._receive(clock.now)  # t0 starting: one slot busy
        assert backend.calls == 1 and len(worker.launcher.starting) == 1
        worker.pacing.filled(0.02)  # as a full receive of 20 ms would: no dry hold
        worker.launcher.note_duration(task_seconds)
        backend.push([Task(cmd="true", id="t1")])
        worker.next_receive = clock.now
        worker._receive(clock.now)
        if not gathers:
            assert backend.calls == 2
            return
        assert backend.calls == 1  # t0 should end within 10 ms: its slot is waited for
        assert 0.005 < worker._next_wakeup() <= 0.01  # no busy loop while it waits
        clock.now += 0.005
        worker._receive(clock.now)
        assert backend.calls == 1
        clock.now += 0.006  # t0 has not ended after all: receive for the one free slot
        worker._receive(clock.now)
        assert backend.calls == 2 and len(worker.launcher.starting) == 2
    finally:
        worker.launcher.cancel_starting()
        backend.close()
