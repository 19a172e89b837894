"""Watchdog.tick() with a fake clock and a fake Signaller: lock loss, stop/kill requests, time
limits, escalation, and the leftovers of an exited shell."""

from __future__ import annotations

import signal
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.settings import safety_margin
from supervisor.worker.watchdog import MAX_SLEEP, Escalation, RunningTask
from tests.fakes.clock import FakeClock
from tests.fakes.worker import T0, RecordingWatchdog, make_dog, make_task, run_until

pytestmark = pytest.mark.timeout(30)

TERM, KILL = signal.SIGTERM, signal.SIGKILL


def escalates(dog: RecordingWatchdog, clock: FakeClock, term_at: float, kill_at: float, *,
              until: float, step: float) -> None:
    """After the SIGTERM at ``term_at``: no SIGKILL before ``kill_at``, one at ``kill_at``,
    nothing more up to ``until``."""
    run_until(dog, clock, kill_at - 1e-6, step=step)
    assert dog.signals() == [(TERM, term_at)]  # no SIGKILL before term_deadline
    clock.now = kill_at
    dog.tick()
    assert dog.signals() == [(TERM, term_at), (KILL, kill_at)]
    run_until(dog, clock, until)
    assert len(dog.sent) == 2


# --------------------------------------------------------------------------- idle
def test_nothing_happens_to_a_healthy_task(clock) -> None:
    dog = make_dog(clock)
    rt = make_task(clock)
    dog.add(rt)
    run_until(dog, clock, T0 + 100)
    assert dog.sent == []
    assert rt.state is Escalation.RUNNING


# --------------------------------------------------------------------------- lock loss
def killed_once(clock: FakeClock, request: Callable[[RunningTask], None], at: float,
                until: float) -> RunningTask:
    """A task watched from T0; ``request`` made at ``at`` SIGKILLs it then, and never again
    up to ``until``."""
    dog = make_dog(clock)
    rt = make_task(clock)
    dog.add(rt)
    dog.tick()
    clock.now = at
    request(rt)
    dog.tick()
    assert dog.signals() == [(KILL, at)]
    assert rt.state is Escalation.KILLED
    run_until(dog, clock, until)
    assert dog.signals() == [(KILL, at)]
    return rt


def test_lock_lost_event_kills_once(clock) -> None:
    # until: well past the keeper's deadline too
    rt = killed_once(clock, lambda rt: rt.keeper.lock_lost.set(), T0 + 3, T0 + 3000)
    assert rt.term_reason == "lock lost"


def test_deadline_passing_without_event_kills_once(clock) -> None:
    dog = make_dog(clock)
    rt = make_task(clock, granted=60.0)
    dog.add(rt)
    deadline = T0 + 60.0 - safety_margin(60.0)
    assert rt.keeper.deadline == deadline
    clock.now = deadline - 0.001
    dog.tick()
    assert dog.sent == []
    clock.now = deadline
    dog.tick()
    assert dog.signals() == [(KILL, deadline)]
    assert not rt.keeper.lock_lost.is_set()  # the watchdog acted on the deadline alone
    run_until(dog, clock, deadline + 50)
    assert dog.signals() == [(KILL, deadline)]


def test_lock_lost_sigterm_behavior_escalates_after_kill_timeout(clock) -> None:
    dog = make_dog(clock, kill_timeout=10.0, lock_lost_behavior="sigterm")
    rt = make_task(clock)
    dog.add(rt)
    clock.now = T0 + 1
    rt.keeper.lock_lost.set()
    dog.tick()
    assert dog.signals() == [(TERM, T0 + 1)]
    assert rt.state is Escalation.TERMINATING
    assert rt.term_deadline == T0 + 11
    escalates(dog, clock, T0 + 1, T0 + 11, until=T0 + 100, step=0.5)
    assert rt.state is Escalation.KILLED


# --------------------------------------------------------------------------- stop / kill
def test_stop_reason_terms_once_then_kills_exactly_at_term_deadline(clock) -> None:
    dog = make_dog(clock, kill_timeout=10.0)
    rt = make_task(clock)
    dog.add(rt)
    clock.now = T0 + 2
    rt.stop_reason = "preempted"
    dog.tick()
    assert dog.signals() == [(TERM, T0 + 2)]
    assert rt.term_reason == "preempted"
    assert rt.term_deadline == T0 + 2 + 10.0
    escalates(dog, clock, T0 + 2, T0 + 12, until=T0 + 60, step=0.3)


def test_kill_lands_on_term_deadline_when_sleeping_as_told(clock) -> None:
    """Drive the clock by tick()'s own answer: the SIGKILL is not late."""
    dog = make_dog(clock, kill_timeout=7.5)
    rt = make_task(clock)
    dog.add(rt)
    rt.stop_reason = "shutdown"
    for _ in range(100):
        wait = dog.tick()
        if rt.state is Escalation.KILLED:
            break
        assert wait > 0
        clock.now += wait
    assert dog.signals() == [(TERM, T0), (KILL, T0 + 7.5)]


def test_kill_timeout_zero_never_escalates(clock) -> None:
    dog = make_dog(clock, kill_timeout=0.0)
    rt = make_task(clock)
    dog.add(rt)
    rt.stop_reason = "shutdown"
    run_until(dog, clock, T0 + 600, step=7.0)
    assert dog.signals() == [(TERM, T0)]
    assert rt.state is Escalation.TERMINATING


def test_kill_reason_kills_at_once(clock) -> None:
    def request(rt: RunningTask) -> None:
        rt.kill_reason = "second signal"

    killed_once(clock, request, T0 + 4, T0 + 60)


def stopped(clock: FakeClock, *, kill_timeout: float,
            reason: str) -> tuple[RecordingWatchdog, RunningTask]:
    """A task watched from T0 and asked to stop; the first tick has sent its SIGTERM."""
    dog = make_dog(clock, kill_timeout=kill_timeout)
    rt = make_task(clock)
    dog.add(rt)
    rt.stop_reason = reason
    dog.tick()
    return dog, rt


def test_kill_reason_after_stop_skips_the_wait(clock) -> None:
    dog, rt = stopped(clock, kill_timeout=600.0, reason="shutdown")
    clock.now = T0 + 1
    rt.kill_reason = "second signal"
    dog.tick()
    assert dog.signals() == [(TERM, T0), (KILL, T0 + 1)]
    run_until(dog, clock, T0 + 700, step=5.0)
    assert len(dog.sent) == 2


# --------------------------------------------------------------------------- time limit
def test_time_limit_terms_with_reason(clock) -> None:
    dog = make_dog(clock, kill_timeout=10.0)
    rt = make_task(clock, time_limit_at=T0 + 30)
    dog.add(rt)
    run_until(dog, clock, T0 + 30 - 0.001)
    assert dog.sent == []
    clock.now = T0 + 30
    dog.tick()
    assert dog.signals() == [(TERM, T0 + 30)]
    assert rt.term_reason == "time limit"
    assert rt.state is Escalation.TERMINATING
    clock.now = T0 + 40
    dog.tick()
    assert dog.signals() == [(TERM, T0 + 30), (KILL, T0 + 40)]


# --------------------------------------------------------------------------- transitions
def test_each_transition_happens_once_even_with_every_reason_at_once(clock) -> None:
    dog = make_dog(clock, kill_timeout=5.0, lock_lost_behavior="sigterm")
    rt = make_task(clock, time_limit_at=T0)
    dog.add(rt)
    rt.stop_reason = "preempted"
    rt.keeper.lock_lost.set()
    states = []
    for _ in range(40):
        dog.tick()
        if not states or states[-1] is not rt.state:
            states.append(rt.state)
        clock.now += 0.5
    assert states == [Escalation.TERMINATING, Escalation.KILLED]
    assert dog.signals() == [(TERM, T0), (KILL, T0 + 5.0)]


def test_two_tasks_are_handled_independently(clock) -> None:
    dog = make_dog(clock, kill_timeout=10.0)
    a, b = make_task(clock, "a"), make_task(clock, "b", time_limit_at=T0 + 3)
    dog.add(a)
    dog.add(b)
    a.kill_reason = "test"
    dog.tick()
    clock.now = T0 + 3
    dog.tick()
    assert dog.signals("a") == [(KILL, T0)]
    assert dog.signals("b") == [(TERM, T0 + 3)]


def test_removed_task_is_not_signalled(clock) -> None:
    dog = make_dog(clock)
    rt = make_task(clock)
    dog.add(rt)
    dog.remove(rt)
    rt.kill_reason = "test"
    dog.tick()
    assert dog.sent == []


# --------------------------------------------------------------------------- tick's answer
def test_tick_wait_bounded_by_max_sleep(clock) -> None:
    dog = make_dog(clock)
    assert 0 < dog.tick() <= MAX_SLEEP
    dog.add(make_task(clock))
    assert 0 < dog.tick() <= MAX_SLEEP


@pytest.mark.parametrize(
    ("granted", "time_limit", "expected"),
    [
        (2700.0, 0.3, 0.3),
        (3.0, None, 2.0),  # 3 s lock, 1 s margin -> deadline in 2 s
        (1.5, None, 1.0),  # deadline in 1.0 s
        (1.2, 5.0, 0.8),  # deadline in 0.8 s beats the time limit
        (2700.0, 0.05, 0.05),
    ],
)
def test_tick_wait_never_exceeds_the_nearest_deadline(clock, granted, time_limit,
                                                      expected) -> None:
    dog = make_dog(clock)
    tl = None if time_limit is None else T0 + time_limit
    dog.add(make_task(clock, granted=granted, time_limit_at=tl))
    wait = dog.tick()
    assert wait == pytest.approx(min(expected, MAX_SLEEP))


def test_tick_wait_while_terminating_is_bounded_by_term_deadline(clock) -> None:
    dog, _rt = stopped(clock, kill_timeout=0.4, reason="stop")
    clock.now = T0 + 0.1
    assert dog.tick() == pytest.approx(0.3)


@settings(database=None, max_examples=200, deadline=None)
@given(
    tasks=st.lists(
        st.tuples(st.floats(min_value=0.5, max_value=100.0),  # lock granted
                  st.one_of(st.none(), st.floats(min_value=0.01, max_value=5.0)),  # time limit
                  st.booleans()),  # stopping
        min_size=1, max_size=4),
    kill_timeout=st.floats(min_value=0.01, max_value=5.0),
)
def test_tick_wait_property(tasks, kill_timeout) -> None:
    clock = FakeClock(T0)
    dog = make_dog(clock, kill_timeout=kill_timeout)
    due = [T0 + MAX_SLEEP]
    for i, (granted, time_limit, stopping) in enumerate(tasks):
        rt = make_task(clock, f"t{i}", granted=granted,
                       time_limit_at=None if time_limit is None else T0 + time_limit)
        rt.stop_reason = "stop" if stopping else None
        dog.add(rt)
        due.append(rt.keeper.deadline)
        if time_limit is not None and not stopping:
            due.append(T0 + time_limit)
        if stopping:
            due.append(T0 + kill_timeout)
    wait = dog.tick()
    assert 0 <= wait <= min(due) - T0 + 1e-9


# --------------------------------------------------------------------------- known bugs
@pytest.mark.parametrize("scenario", ["time limit", "stop with kill_timeout 0",
                                      "lock lost, sigterm behavior"])
def test_tick_does_not_busy_loop_while_waiting_for_escalation(clock, scenario) -> None:
    if scenario == "time limit":
        dog = make_dog(clock, kill_timeout=10.0)
        rt = make_task(clock, time_limit_at=T0)
    elif scenario == "stop with kill_timeout 0":
        dog = make_dog(clock, kill_timeout=0.0)
        rt = make_task(clock)
        rt.stop_reason = "shutdown"
    else:
        dog = make_dog(clock, kill_timeout=10.0, lock_lost_behavior="sigterm")
        rt = make_task(clock, granted=3.0)  # deadline at T0 + 2
        clock.now = T0 + 2
    dog.add(rt)
    dog.tick()
    assert dog.signals() == [(TERM, clock.now)]
    clock.now += 1.0
    # nothing is due for several seconds (or ever, with kill_timeout 0): tick must sleep
    assert dog.tick() > 0


def test_killed_task_is_not_killed_again_when_its_lock_is_lost_later(clock) -> None:
    dog = make_dog(clock)
    rt = make_task(clock)
    dog.add(rt)
    rt.kill_reason = "second signal"
    dog.tick()
    assert dog.signals() == [(KILL, T0)]
    clock.now = T0 + 1
    rt.keeper.lock_lost.set()
    dog.tick()
    assert dog.signals() == [(KILL, T0)]


def test_lock_loss_of_a_tree_already_gone_says_so(clock, caplog) -> None:
    # A frozen supervisor wakes to a task its lifeline killed: one line, and not "sending".
    dog = make_dog(clock)
    rt = make_task(clock, granted=60.0)
    dog.add(rt)
    dog.signaller.groups.discard(rt.proc.pgid)  # the tree died while we were frozen
    clock.now = rt.keeper.deadline + 20
    with caplog.at_level("ERROR", logger="jobq"):
        dog.tick()
    lines = [r.getMessage() for r in caplog.records if "lock lost" in r.getMessage()]
    assert lines == ["lock lost (lease deadline passed without a successful renewal): "
                     "the task's process tree was already gone"], lines
