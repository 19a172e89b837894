"""Watchdog.tick() with a fake clock: lock loss, stop/kill requests, time limits, escalation."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.lease import LeaseKeeper
from supervisor.settings import safety_margin
from supervisor.watchdog import MAX_SLEEP, Escalation, RunningTask, Watchdog

pytestmark = pytest.mark.timeout(30)

T0 = 5000.0
TERM, KILL = signal.SIGTERM, signal.SIGKILL


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeLease:
    def renew(self, timeout: float) -> float:  # pragma: no cover - never driven here
        raise AssertionError("the watchdog must never talk to the backend")


class FakePopen:
    returncode = None


@dataclass(eq=False)
class FakeProc:
    pid: int
    pgid: int
    marker: str
    popen: FakePopen = field(default_factory=FakePopen)

    def group_alive(self) -> bool:
        return True


class RecordingWatchdog(Watchdog):
    """Records (task_id, signal, now) instead of signalling anything."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sent: list[tuple[str, int, float]] = []

    def signal_tasks(self, rts, sig) -> None:
        for rt in rts:
            self.sent.append((rt.task_id, sig, self.clock()))

    def signals(self, task_id: str = "t1") -> list[tuple[int, float]]:
        return [(sig, t) for tid, sig, t in self.sent if tid == task_id]


_pids = iter(range(40000, 50000))


def make_task(clock: FakeClock, task_id: str = "t1", *, granted: float = 2700.0,
              time_limit_at: float | None = None) -> RunningTask:
    pid = next(_pids)
    keeper = LeaseKeeper(FakeLease(), task_id, t_sent=clock.now, granted=granted,
                         renew_interval=granted / 3, clock=clock)
    return RunningTask(task_id=task_id, attempt=1,
                       proc=FakeProc(pid=pid, pgid=pid, marker=f"m-{task_id}-{pid}"),
                       keeper=keeper, started=clock.now, time_limit_at=time_limit_at)


def make_dog(clock: FakeClock, *, kill_timeout: float = 10.0,
             lock_lost_behavior: str = "sigkill") -> RecordingWatchdog:
    return RecordingWatchdog(kill_timeout=kill_timeout, lock_lost_behavior=lock_lost_behavior,
                             clock=clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def run_until(dog: Watchdog, clock: FakeClock, end: float, step: float = 0.25) -> None:
    """Tick repeatedly while the clock moves to ``end`` in small steps."""
    while clock.now < end:
        dog.tick()
        clock.now = min(end, clock.now + step)
    dog.tick()


# --------------------------------------------------------------------------- idle
def test_nothing_happens_to_a_healthy_task(clock) -> None:
    dog = make_dog(clock)
    rt = make_task(clock)
    dog.add(rt)
    run_until(dog, clock, T0 + 100)
    assert dog.sent == []
    assert rt.state is Escalation.RUNNING


# --------------------------------------------------------------------------- lock loss
def test_lock_lost_event_kills_once(clock) -> None:
    dog = make_dog(clock)
    rt = make_task(clock)
    dog.add(rt)
    dog.tick()
    clock.now += 3
    rt.keeper.lock_lost.set()
    dog.tick()
    assert dog.signals() == [(KILL, T0 + 3)]
    assert rt.state is Escalation.KILLED
    assert rt.term_reason == "lock lost"
    run_until(dog, clock, T0 + 3000)  # well past the keeper's deadline too
    assert dog.signals() == [(KILL, T0 + 3)]


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
    run_until(dog, clock, T0 + 11 - 0.001, step=0.5)
    assert dog.signals() == [(TERM, T0 + 1)]
    clock.now = T0 + 11
    dog.tick()
    assert dog.signals() == [(TERM, T0 + 1), (KILL, T0 + 11)]
    assert rt.state is Escalation.KILLED
    run_until(dog, clock, T0 + 100)
    assert len(dog.sent) == 2


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
    run_until(dog, clock, T0 + 12 - 1e-6, step=0.3)
    assert dog.signals() == [(TERM, T0 + 2)]  # no SIGKILL before term_deadline
    clock.now = T0 + 12
    dog.tick()
    assert dog.signals() == [(TERM, T0 + 2), (KILL, T0 + 12)]
    run_until(dog, clock, T0 + 60)
    assert len(dog.sent) == 2


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
    dog = make_dog(clock)
    rt = make_task(clock)
    dog.add(rt)
    dog.tick()
    clock.now = T0 + 4
    rt.kill_reason = "second signal"
    dog.tick()
    assert dog.signals() == [(KILL, T0 + 4)]
    assert rt.state is Escalation.KILLED
    run_until(dog, clock, T0 + 60)
    assert dog.signals() == [(KILL, T0 + 4)]


def test_kill_reason_after_stop_skips_the_wait(clock) -> None:
    dog = make_dog(clock, kill_timeout=600.0)
    rt = make_task(clock)
    dog.add(rt)
    rt.stop_reason = "shutdown"
    dog.tick()
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
    dog = make_dog(clock, kill_timeout=0.4)
    rt = make_task(clock)
    dog.add(rt)
    rt.stop_reason = "stop"
    dog.tick()
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
    clock = FakeClock()
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
