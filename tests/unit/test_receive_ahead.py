"""Receive-ahead (ahead.py, through the Launcher): how many leases a receive takes beyond the
free slots, and that a held lease starts only within its hold bound and before its lease
deadline -- else it goes back at once uncounted, or, past its deadline, is neither started nor
settled.  A fake clock; nothing is spawned (the spawner threads never start)."""

from __future__ import annotations

import queue
from typing import Any

import pytest
from test_settlement import RETURN_DELAY, Harness, settled

from supervisor.core.task import Task
from supervisor.worker.keeper import lease_deadline
from supervisor.worker.launch import Launcher
from supervisor.worker.metrics import Metrics
from supervisor.worker.output_pump import OutputPump
from supervisor.worker.receive_ahead import HOLD_MAX, MIN_CYCLE
from supervisor.worker.task_guard import TaskGuard
from supervisor.worker.watchdog import Watchdog
from tests.fakes.lease import FakeLease

pytestmark = pytest.mark.timeout(30)


def launcher(*, can_hold: bool = True, max_receive: int | None = 32,
             **settings: Any) -> tuple[Harness, Launcher]:
    h = Harness(**settings)
    backend = h.settlement.backend
    backend.receive_ahead = can_hold  # type: ignore[misc]
    backend.max_receive = max_receive  # type: ignore[misc]
    la = Launcher(h.settlement.s, TaskGuard(), h.settlement,
                  Metrics(None, backend="fake", queue="q"),
                  Watchdog(kill_timeout=10.0, lock_lost_behavior="sigkill", clock=h.clock),
                  OutputPump(), queue.SimpleQueue(), "tok", h.clock)
    return h, la


def leases(n: int, granted: float = 2700.0) -> list[FakeLease]:
    out = []
    for i in range(n):
        lease = FakeLease(task=Task(cmd="true", id=f"t{i}"))
        lease.message_id = f"m{i}"
        lease.lock_duration = granted
        out.append(lease)
    return out


def started(la: Launcher) -> list[str]:
    return [job.context.task.id for job in la.starting]


def given_back(h: Harness, task_id: str) -> tuple[list[tuple], str]:
    """The broker calls made on a held lease that went back, and how it went back."""
    keeper, _, kind = h.settlement.awaiting_return[task_id]
    return settled(keeper), kind


# ------------------------------------------------------------------------------ sizing
def test_no_receive_ahead_until_tasks_are_known_short_or_where_holding_is_not_cheap() -> None:
    h, la = launcher(num_workers=4)
    assert la.ahead(4) == 0  # no task has run yet
    la.note_duration(5.0)
    assert la.ahead(4) == 0  # long tasks: held work would wait for minutes
    h, la = launcher(can_hold=False, num_workers=4)
    la.note_duration(0.01)
    assert la.ahead(4) == 0


def test_a_receive_takes_what_the_slots_start_within_half_the_bound_up_to_max_receive() -> None:
    _, la = launcher(num_workers=1)
    la.note_duration(0.25)  # one slot starts 4 tasks in half of 2 s: 4 held, no more
    assert la.ahead(1) == int(1 * HOLD_MAX * 0.5 / 0.25) == 4
    _, la = launcher(num_workers=4)
    la.note_duration(0.001)  # shorter than a slot's own cycle: sized by that
    assert MIN_CYCLE > 0.001
    assert la.ahead(3) == 32 - 3  # the service's limit per receive
    _, la = launcher(num_workers=4, max_receive=None)
    la.note_duration(0.001)  # a backend without a limit (SQLite): one per slot, as before
    assert la.ahead(4) == 4


def test_what_is_held_counts_against_the_next_receive() -> None:
    h, la = launcher(num_workers=1)
    la.note_duration(0.25)
    la.hold(leases(3), h.clock.now)
    assert la.ahead(1) == 1


# ------------------------------------------------------------------------------ the bound
def test_a_held_lease_starts_within_its_bound_else_goes_back_at_once_uncounted() -> None:
    h, la = launcher()
    t0 = h.clock.now
    la.hold(leases(3), t0)
    assert la.expire_ready(t0) == t0 + HOLD_MAX  # when the main loop must wake
    h.clock.now = t0 + HOLD_MAX - 0.1
    assert la.expire_ready(h.clock.now) == t0 + HOLD_MAX
    assert la.take_ready(1) == 1 and started(la) == ["t0"]
    h.clock.now = t0 + HOLD_MAX
    assert la.expire_ready(h.clock.now) == float("inf")
    assert not la.ready and started(la) == ["t0"]
    for tid in ("t1", "t2"):
        assert given_back(h, tid) == ([("release", False, 0.0)], "released")
    assert h.settlement.counts == h.counts()  # no outcome, no attempt


def test_take_ready_checks_the_bound_on_the_clock_now() -> None:
    """The main loop may stall after expire_ready: take_ready itself refuses a stale lease."""
    h, la = launcher()
    t0 = h.clock.now
    la.hold(leases(2), t0)
    la.expire_ready(t0 + 1.0)
    h.clock.now = t0 + HOLD_MAX + 0.5  # held up between the two calls
    assert la.take_ready(2) == 0 and started(la) == []
    assert given_back(h, "t0") == ([("release", False, 0.0)], "released")
    assert given_back(h, "t1") == ([("release", False, 0.0)], "released")


def test_the_bound_is_an_eighth_of_a_short_lock() -> None:
    h, la = launcher(lock_duration=8.0)
    t0 = h.clock.now
    la.hold(leases(1, granted=8.0), t0)
    assert la.expire_ready(t0) == t0 + 1.0


# --------------------------------------------------------------------------- the deadline
def test_a_lease_granted_less_than_asked_starts_only_well_before_its_deadline() -> None:
    """The broker granted 5 s (asked: 2700): the lease deadline comes before the hold bound
    would; the lease starts only while a hold bound is left before that deadline."""
    h, la = launcher()
    t0 = h.clock.now
    la.hold(leases(2, granted=5.0), t0)
    deadline = lease_deadline(t0, 5.0)
    until = deadline - HOLD_MAX
    assert until < t0 + HOLD_MAX
    assert la.expire_ready(t0) == until
    h.clock.now = until - 0.01
    assert la.take_ready(1) == 1 and started(la) == ["t0"]
    h.clock.now = until
    assert la.take_ready(1) == 0 and started(la) == ["t0"]
    assert given_back(h, "t1") == ([("release", False, 0.0)], "released")


def test_a_held_lease_past_its_deadline_is_neither_started_nor_settled() -> None:
    h, la = launcher()
    t0 = h.clock.now
    held = leases(3, granted=30.0)
    la.hold(held, t0)
    h.clock.now = lease_deadline(t0, 30.0)  # a stalled main loop wakes at the deadline
    assert la.take_ready(1) == 0 and started(la) == []
    la.release_ready()  # and then stops
    assert not la.ready
    for lease in held:
        calls, kind = given_back(h, lease.task.id)
        assert (calls, kind) == ([], "lost")  # the broker brings it back at lock expiry
        keeper = h.settlement.awaiting_return[lease.task.id][0]
        assert not h.settlement.all_back_by(keeper.expires + RETURN_DELAY - 0.01)
    assert h.settlement.all_back_by(t0 + 30.0 + RETURN_DELAY + h.settlement.s.poll_interval)
    assert h.settlement.counts == h.counts()


def test_a_stop_gives_every_held_lease_back_uncounted() -> None:
    h, la = launcher()
    t0 = h.clock.now
    la.hold(leases(5), t0)
    h.clock.now = t0 + 0.5
    la.release_ready()
    assert not la.ready and started(la) == []
    for i in range(5):
        assert given_back(h, f"t{i}") == ([("release", False, 0.0)], "released")


# ------------------------------------------------------------------ the worker's wake-up
def test_the_worker_does_not_spin_once_a_pause_gave_held_leases_back(tmp_path) -> None:
    """While a lease is held the main loop wakes for its bound; once a pause gave it back the
    loop waits its poll again (it used to keep the stale bound and spin on 0 s waits)."""
    from supervisor.backends.sqlite.backend import SqliteBackend
    from supervisor.core.settings import Settings
    from supervisor.worker.loop import Worker

    h = Harness()
    db = str(tmp_path / "q.db")
    backend = SqliteBackend(db, "default", "w")
    try:
        backend.push([Task(cmd="true", id=f"t{i}") for i in range(3)])
        worker = Worker(Settings(sqlite_path=db, worker_id="w", poll_interval=1.0,
                                 num_workers=1), backend, clock=h.clock)
        worker._report(h.clock.now)  # nothing due from the reporter for a while
        worker.launcher.note_duration(0.01)  # short tasks: one lease more than the slot
        t0 = h.clock.now
        worker.next_receive = t0
        worker._receive(t0)  # one dispatched (the spawner is not running), one held
        assert len(worker.launcher.starting) == 1 and len(worker.launcher.ready) == 1
        worker.paused = True
        h.clock.now = t0 + HOLD_MAX - 0.5
        assert worker._next_wakeup() == pytest.approx(0.5)  # the held lease's bound
        worker.launcher.release_ready()  # what a turn does while paused
        h.clock.now = t0 + HOLD_MAX + 1.0
        assert worker._next_wakeup() > 0.5
        worker.launcher.cancel_starting()
    finally:
        backend.close()
