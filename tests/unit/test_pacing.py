"""When the next receive may go (pacing.py): after a receive that left a slot empty, none
while tasks are starting or settling, for at most a poll interval.  A fake clock; nothing is
spawned (the spawner threads never start)."""

from __future__ import annotations

import pytest
from supervisor_fakes import FakeClock

from supervisor.backends.sqlite import SqliteBackend
from supervisor.pacing import ReceivePacing
from supervisor.settings import Settings
from supervisor.task import Task
from supervisor.worker import Worker

pytestmark = pytest.mark.timeout(30)


def test_a_dry_receive_holds_the_next_while_work_is_in_flight_for_a_poll_at_most() -> None:
    pacing = ReceivePacing(poll_interval=1.0)
    assert not pacing.holds(100.0, True)  # nothing ran dry yet
    pacing.ran_dry(100.0)
    assert pacing.holds(100.5, True)
    assert not pacing.holds(100.5, False)  # nothing starting or settling: receive
    assert not pacing.holds(101.0, True)  # a hung settlement holds it a poll, no longer
    pacing.ran_dry(102.0)
    pacing.filled()  # the queue has work again: no hold
    assert not pacing.holds(102.1, True)


class Counting(SqliteBackend):
    calls = 0

    def receive(self, max_messages, lock_duration):  # type: ignore[no-untyped-def]
        Counting.calls += 1
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
        assert Counting.calls == 1 and len(worker.launcher.starting) == 1
        backend.push([Task(cmd="true", id="t1")])
        worker.next_receive = clock.now  # as a reaped task would
        clock.now += 0.5
        worker._receive(clock.now)
        assert Counting.calls == 1  # held: t0 is still starting
        clock.now += 0.6  # a poll after the dry receive: the hold is over
        worker._receive(clock.now)
        assert Counting.calls == 2 and len(worker.launcher.starting) == 2
        worker.launcher.cancel_starting()
    finally:
        backend.close()
