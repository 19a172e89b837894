"""Lifecycle: the worker's state transitions and the requests they leave on running tasks.

running -> draining (SIGUSR1) / stopping (SIGTERM, SIGINT, SIGHUP; a second one asks for
kills; SIGXCPU, never a second) /
preempting (Scheduled Events; a cancelled event resumes); and the stops that --time-limit,
--idle-timeout and --max-consecutive-failures cause; a reload (SIGUSR2) moves none.  A fake
clock, a fake notifier and watchdog (they record what they were told), a real Settings and a
real event queue.
"""

from __future__ import annotations

import logging
import queue
import signal
import time
from typing import Any

import pytest

from supervisor.core.settings import EXIT_FAILURES, EXIT_OK, Settings
from supervisor.worker.lifecycle import PREEMPT_MARGIN, Lifecycle, State
from supervisor.worker.preemption import PreemptEvent
from supervisor.worker.watchdog import RunningTask
from tests.fakes.clock import FakeClock
from tests.fakes.worker import make_task

pytestmark = pytest.mark.timeout(30)

T0 = 3000.0


class FakeNotifier:
    def __init__(self) -> None:
        self.stopping_sent = 0

    def stopping(self) -> bool:
        self.stopping_sent += 1
        return True


class FakeWatchdog:
    def __init__(self) -> None:
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


class Harness:
    def __init__(self, tasks: int = 2, **settings: Any) -> None:
        self.clock = FakeClock(T0)
        self.notifier = FakeNotifier()
        self.watchdog = FakeWatchdog()
        self.lc = Lifecycle(Settings(**settings), self.notifier, self.watchdog,
                            queue.SimpleQueue(), self.clock)
        self.active: list[RunningTask] = [make_task(self.clock, f"t{i}") for i in range(tasks)]

    def requests(self) -> list[tuple[str | None, float | None, str | None]]:
        return [(rt.stop_reason, rt.stop_kill_timeout, rt.kill_reason) for rt in self.active]

    def untouched(self) -> bool:
        return self.requests() == [(None, None, None)] * len(self.active)


def preempt(not_before_in: float | None) -> PreemptEvent:
    """A Preempt event whose NotBefore is this far ahead of the wall clock (None: no time)."""
    when = None if not_before_in is None else time.time() + not_before_in
    return PreemptEvent("ev-1", "Preempt", when)


def test_a_new_worker_runs_and_exits_ok() -> None:
    lc = Harness().lc
    assert (lc.state, lc.stop_reason, lc.exit_code) == (State.RUNNING, "", EXIT_OK)


# --------------------------------------------------------------------------- draining
def test_sigusr1_drains_and_lets_running_tasks_finish() -> None:
    h = Harness()
    h.lc.on_signal(signal.SIGUSR1, h.active)
    assert (h.lc.state, h.lc.stop_reason, h.lc.exit_code) == (
        State.DRAINING, "drained (SIGUSR1)", EXIT_OK)
    assert h.untouched() and h.watchdog.wakes == 0
    assert h.notifier.stopping_sent == 1


def test_sigusr1_is_ignored_unless_running() -> None:
    h = Harness()
    h.lc.on_signal(signal.SIGTERM, h.active)
    h.lc.on_signal(signal.SIGUSR1, h.active)
    assert (h.lc.state, h.lc.stop_reason) == (State.STOPPING, "SIGTERM received")


# --------------------------------------------------------------------------- stopping
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU])
def test_stop_signal_requeues_every_running_task(sig: int) -> None:
    h = Harness()
    h.active[1].stop_reason = "cancelled"  # an earlier request is kept
    h.lc.on_signal(sig, h.active)
    name = signal.Signals(sig).name
    assert (h.lc.state, h.lc.stop_reason, h.lc.exit_code) == (
        State.STOPPING, f"{name} received", EXIT_OK)
    assert h.requests() == [("preempted", None, None), ("cancelled", None, None)]
    assert h.watchdog.wakes == 1 and h.notifier.stopping_sent == 1


def test_second_stop_signal_asks_to_kill_every_task_now() -> None:
    h = Harness()
    h.lc.on_signal(signal.SIGTERM, h.active)
    h.lc.on_signal(signal.SIGINT, h.active)
    assert h.requests() == [("preempted", None, "second SIGINT")] * 2
    assert h.watchdog.wakes == 2
    assert (h.lc.state, h.lc.stop_reason) == (State.STOPPING, "SIGTERM received")


def test_sighup_after_sigterm_is_the_second_signal() -> None:
    h = Harness()
    h.lc.on_signal(signal.SIGTERM, h.active)
    h.lc.on_signal(signal.SIGHUP, h.active)
    assert h.requests() == [("preempted", None, "second SIGHUP")] * 2


def test_repeated_sigxcpu_never_kills() -> None:
    """The kernel repeats SIGXCPU every CPU second past the soft limit: no escalation, and
    an operator's SIGTERM after it is still the first stop signal."""
    h = Harness()
    for _ in range(3):
        h.lc.on_signal(signal.SIGXCPU, h.active)
    h.lc.on_signal(signal.SIGTERM, h.active)
    assert h.requests() == [("preempted", None, None)] * 2
    assert (h.lc.state, h.lc.stop_reason) == (State.STOPPING, "SIGXCPU received")


@pytest.mark.parametrize("sig", [signal.SIGALRM, signal.SIGPWR, signal.SIGQUIT,
                                 signal.SIGRTMIN + 3])
def test_signals_meaning_nothing_change_nothing(sig: int, caplog: Any) -> None:
    h = Harness()
    h.lc.on_signal(sig, h.active)
    assert h.lc.state is State.RUNNING and h.untouched() and h.watchdog.wakes == 0
    assert "received" in caplog.text


# ---------------------------------------------------------------------------- reload
def test_sigusr2_reloads_a_running_worker_and_changes_nothing_else() -> None:
    """Issue 40: ``systemctl reload`` (SIGUSR2) used to be a drain; now it is a reload."""
    h = Harness()
    reloads: list[int] = []
    h.lc.reload = lambda: reloads.append(1)
    h.lc.on_signal(signal.SIGUSR2, h.active)
    h.lc.on_signal(signal.SIGUSR2, h.active)
    assert reloads == [1, 1]
    assert h.lc.state is State.RUNNING and h.untouched() and h.watchdog.wakes == 0
    assert h.notifier.stopping_sent == 0


@pytest.mark.parametrize("first", [signal.SIGUSR1, signal.SIGTERM])
def test_a_draining_or_stopping_worker_ignores_a_reload(first: int, caplog: Any) -> None:
    h = Harness()
    reloads: list[int] = []
    h.lc.reload = lambda: reloads.append(1)
    h.lc.on_signal(first, h.active)
    state = h.lc.state
    h.lc.on_signal(signal.SIGUSR2, h.active)
    assert reloads == [] and h.lc.state is state
    assert f"SIGUSR2 received: reload ignored while {state.value}" in caplog.text


def test_a_sighup_inherited_ignored_stays_ignored(caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    h = Harness()
    h.lc.on_signal(signal.SIGHUP, h.active, inherited_ignored=True)
    assert h.lc.state is State.RUNNING and h.untouched()
    assert "SIGHUP received: ignored (the worker was started with it ignored" in caplog.text


def test_stop_signal_while_draining_still_requeues() -> None:
    h = Harness()
    h.lc.on_signal(signal.SIGUSR1, h.active)
    h.lc.on_signal(signal.SIGTERM, h.active)
    assert (h.lc.state, h.lc.stop_reason) == (State.STOPPING, "SIGTERM received")
    assert h.requests() == [("preempted", None, None)] * 2


def test_a_stop_happens_once() -> None:
    h = Harness()
    h.lc.begin_stop("first", EXIT_FAILURES, h.active)
    h.lc.begin_stop("second", EXIT_OK, h.active)
    assert (h.lc.stop_reason, h.lc.exit_code) == ("first", EXIT_FAILURES)
    assert h.watchdog.wakes == 1 and h.notifier.stopping_sent == 1


# --------------------------------------------------------------------------- limits
def test_worker_time_limit_stops_at_the_limit() -> None:
    h = Harness(time_limit=60.0)
    h.lc.check_limits(T0 + 60.0 - 0.001, T0, h.active)
    assert h.lc.state is State.RUNNING
    h.lc.check_limits(T0 + 60.0, T0, h.active)
    assert (h.lc.state, h.lc.stop_reason, h.lc.exit_code) == (
        State.STOPPING, "worker time limit reached", EXIT_OK)
    assert h.requests() == [("preempted", None, None)] * 2


def test_idle_timeout_counts_only_without_tasks() -> None:
    h = Harness(idle_timeout=30.0)
    h.lc.check_limits(T0 + 100.0, T0, h.active)
    assert h.lc.state is State.RUNNING  # tasks run: not idle, however long
    h.lc.check_limits(T0 + 30.0 - 0.001, T0, [])
    assert h.lc.state is State.RUNNING
    h.lc.check_limits(T0 + 30.0, T0, [])
    assert (h.lc.state, h.lc.stop_reason, h.lc.exit_code) == (
        State.STOPPING, "idle timeout", EXIT_OK)


def test_no_limits_no_stop() -> None:
    h = Harness()
    h.lc.check_limits(T0 + 1e6, T0, [])
    assert h.lc.state is State.RUNNING


def test_failure_streak_stops_with_its_own_exit_code() -> None:
    h = Harness()
    h.lc.failure_streak(3, h.active)
    assert (h.lc.state, h.lc.stop_reason, h.lc.exit_code) == (
        State.STOPPING, "too many consecutive failures", EXIT_FAILURES)
    assert h.requests() == [("preempted", None, None)] * 2


def test_failure_streak_while_draining_changes_nothing() -> None:
    h = Harness()
    h.lc.on_signal(signal.SIGUSR1, h.active)
    h.lc.failure_streak(3, h.active)
    assert (h.lc.state, h.lc.exit_code) == (State.DRAINING, EXIT_OK)
    assert h.untouched()


# --------------------------------------------------------------------------- preempting
def test_preempt_event_requeues_tasks_with_sigkill_before_not_before() -> None:
    h = Harness(kill_timeout=600.0)
    assert not h.lc.on_scheduled_event(preempt(100.0), h.active)
    assert h.lc.state is State.PREEMPTING
    assert h.watchdog.wakes == 1
    for reason, kill_timeout, kill in h.requests():
        assert (reason, kill) == ("preempted", None)
        # NotBefore is read off the wall clock: allow for the time this test took
        assert kill_timeout == pytest.approx(100.0 - PREEMPT_MARGIN, abs=1.0)


@pytest.mark.parametrize(("kill_timeout", "not_before_in", "expected"), [
    (600.0, 3600.0, 600.0),  # kill_timeout comes first
    (600.0, -10.0, 0.0),  # NotBefore has passed: no grace at all
    (45.0, None, 45.0),  # no time given: kill_timeout
    (0.0, None, None),  # kill_timeout 0 and no time: never SIGKILL
])
def test_preempt_grace(kill_timeout: float, not_before_in: float | None,
                       expected: float | None) -> None:
    h = Harness(kill_timeout=kill_timeout)
    h.lc.on_scheduled_event(preempt(not_before_in), h.active)
    assert h.requests() == [("preempted", expected, None)] * 2


def test_preempt_keeps_an_earlier_stop_request() -> None:
    h = Harness()
    h.active[0].stop_reason = "cancelled"
    h.lc.on_scheduled_event(preempt(None), h.active)
    assert h.requests()[0] == ("cancelled", None, None)


def test_cancelled_event_resumes_receiving() -> None:
    h = Harness()
    assert not h.lc.on_scheduled_event(None, h.active)  # nothing to cancel
    h.lc.on_scheduled_event(preempt(None), h.active)
    assert h.lc.on_scheduled_event(None, h.active)
    assert h.lc.state is State.RUNNING and h.lc.preempt_event is None


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGUSR1])
def test_events_are_ignored_once_stopping_or_draining(first: int) -> None:
    h = Harness()
    h.lc.on_signal(first, h.active)
    before = (h.lc.state, h.requests(), h.watchdog.wakes)
    assert not h.lc.on_scheduled_event(preempt(60.0), h.active)
    assert not h.lc.on_scheduled_event(None, h.active)
    assert (h.lc.state, h.requests(), h.watchdog.wakes) == before


def test_stop_signal_while_preempting_stops() -> None:
    h = Harness()
    h.lc.on_scheduled_event(preempt(None), h.active)
    h.lc.on_signal(signal.SIGTERM, h.active)
    assert (h.lc.state, h.lc.stop_reason) == (State.STOPPING, "SIGTERM received")
    assert not h.lc.on_scheduled_event(None, h.active)  # a cancel no longer resumes
    assert h.lc.state is State.STOPPING
