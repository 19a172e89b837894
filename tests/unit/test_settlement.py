"""Settlement: what becomes of a lease once its task is over, or once it must not run.

Driven through its public surface with a fake clock, a real Settings, TaskGuard and Metrics
(no metrics file), and a FakeLease that records the broker call the lease's keeper made.
"""

from __future__ import annotations

import contextlib
import re
import signal
from typing import Any

import pytest

from supervisor.backends.base import LeaseLost
from supervisor.core.settings import Settings
from supervisor.core.task import Task
from supervisor.worker.keeper import LeaseKeeper
from supervisor.worker.limits import TaskLimits
from supervisor.worker.metrics import Metrics
from supervisor.worker.outcomes import Ended, SettleResult, Unsettled
from supervisor.worker.settlement import Settlement, cancel_reason
from supervisor.worker.task_guard import TaskGuard
from supervisor.worker.watchdog import RunningTask
from tests.fakes.backend import FakeBackend
from tests.fakes.clock import FakeClock
from tests.fakes.lease import FakeLease
from tests.fakes.worker import FakeOutput, make_task

pytestmark = pytest.mark.timeout(30)

T0 = 1000.0
WALL0 = 1_700_000_000.0  # the injected wall clock at T0
RETURN_DELAY = FakeBackend.lost_lease_return_delay
SETTLED_WITHIN = 10.0  # generous: the keeper's own thread may make the call


class Harness:
    def __init__(self, guard: TaskGuard | None = None, **settings: Any) -> None:
        values: dict[str, Any] = {"max_attempts": 3, "retry_delay": 10.0,
                                  "retry_delay_max": 600.0, "poll_interval": 1.0,
                                  "task_time_limit": 30.0}
        values.update(settings)
        self.clock = FakeClock(T0)
        self.streaks: list[int] = []
        self.settlement = Settlement(Settings(**values), FakeBackend(),
                                     guard or TaskGuard(), Metrics(None, backend="fake",
                                                                   queue="q"),
                                     self.streaks.append, clock=self.clock,
                                     wall=lambda: WALL0 + self.clock.now - T0)

    def finished(self, rc: int, *, attempt: int = 1, output: str = "", task: Task | None = None,
                 granted: float = 2700.0, **requests: Any) -> RunningTask:
        """A task whose shell exited with ``rc``; ``requests`` set RunningTask fields
        (stop_reason, term_reason, lock_loss_handled)."""
        rt = make_task(self.clock, lease=FakeLease(attempt=attempt, task=task), granted=granted,
                       attempt=attempt, task=task)
        rt.proc.returncode = rc
        rt.proc.output = FakeOutput(output)
        for name, value in requests.items():
            setattr(rt, name, value)
        return rt

    def conclude(self, rc: int, *, stopping: bool = False, **kwargs: Any) -> list[tuple]:
        """Conclude a task that exited with ``rc``; the broker calls its keeper made."""
        rt = self.finished(rc, **kwargs)
        self.settlement.conclude(rt, self.clock.now, stopping=stopping)
        return settled(rt.keeper)

    def counts(self, **nonzero: int) -> dict[str, int]:
        return {**dict.fromkeys(self.settlement.counts, 0), **nonzero}


def settled(keeper: LeaseKeeper) -> list[tuple]:
    assert keeper.join(SETTLED_WITHIN), "the keeper never finished settling"
    calls: list[tuple] = keeper.lease.calls
    return calls


# --------------------------------------------------------------------------- succeeded
def test_success_completes_the_message() -> None:
    h = Harness()
    assert h.conclude(0) == [("complete",)]
    assert h.settlement.counts == h.counts(succeeded=1)
    assert h.settlement.awaiting_return == {}


def test_a_refused_settlement_counts_as_a_lost_lease_not_a_success() -> None:
    """The broker refused the completion (its queue was deleted, the lock ran out): the
    message comes back, so the summary says lock_lost, not succeeded."""
    h = Harness()
    rt = h.finished(0)
    rt.keeper.lease.refuse = LeaseLost("404 QueueNotFound")
    h.settlement.conclude(rt, h.clock.now, stopping=False)
    assert settled(rt.keeper) == [("complete",)]
    assert h.settlement.counts == h.counts(succeeded=1)  # decided; not yet known refused
    h.settlement.prune()
    assert h.settlement.counts == h.counts(lock_lost=1)
    h.settlement.prune()  # counted once
    assert h.settlement.counts == h.counts(lock_lost=1)


class QuickBackend(FakeBackend):
    """A backend whose leases the main thread settles itself (SQLite's ``quick_settle``)."""

    quick_settle = True

    def quick_writes(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


@pytest.mark.parametrize("rc, requests, decided", [
    (0, {}, Ended.SUCCEEDED),
    (1, {}, Ended.RETRIED),
    (1, {"attempt": 3}, Ended.FAILED),
    (-signal.SIGTERM, {"stop_reason": "preempted"}, Ended.REQUEUED),
])
def test_a_settlement_refused_on_the_quick_path_is_counted_at_once(
        rc: int, requests: dict[str, Any], decided: Ended) -> None:
    """Issue 27: the settlement is told the keeper's typed result as soon as it is known --
    on the quick path, at once, not at a later prune reading the keeper's words back.  The
    decided outcome is undone by its enum, whatever it was."""
    h = Harness()
    h.settlement.backend = QuickBackend()
    h.settlement.quick_settle = True
    rt = h.finished(rc, **requests)
    rt.keeper.lease.refuse = LeaseLost("404 QueueNotFound")
    h.settlement.conclude(rt, h.clock.now, stopping=False)
    assert rt.keeper.done.is_set() and not h.settlement.settling  # no thread, nothing left
    assert rt.keeper.result == SettleResult(
        decided, Unsettled.REFUSED, "the broker refused the settlement: 404 QueueNotFound")
    assert h.settlement.counts == h.counts(lock_lost=1)
    h.settlement.prune()  # counted once
    assert h.settlement.counts == h.counts(lock_lost=1)


def test_each_outcome_names_its_count() -> None:
    h = Harness()
    counted = {e.count for e in Ended} - {None}
    assert counted == set(h.settlement.counts)
    assert Ended.RETURNED.count is None and Ended.EXPIRED.count is None


def test_outcomes_are_counted_per_queue_too() -> None:
    """A worker with several queues: each queue's worker record shows what came from it."""
    h = Harness()

    def conclude(rc: int, queue: str | None, attempt: int = 1,
                 refuse: Exception | None = None) -> None:
        rt = h.finished(rc, attempt=attempt)
        if queue is not None:
            rt.keeper.lease.queue = queue
        rt.keeper.lease.refuse = refuse
        h.settlement.conclude(rt, h.clock.now, stopping=False)
        settled(rt.keeper)
        h.settlement.prune()

    conclude(0, "high")
    conclude(0, "high")
    conclude(1, "low", attempt=3)  # its last attempt: failed for good
    conclude(1, "low", attempt=1)  # retried: not on the record
    conclude(0, "high", refuse=LeaseLost("lock lost"))  # decided, then refused: not counted
    conclude(0, None)  # a single queue's lease: the settings' queue
    snap = h.settlement.snapshot()
    assert snap == h.settlement.counts and snap is not h.settlement.counts
    assert snap.per_queue == {
        "high": {"succeeded": 2, "failed": 0, "dead_lettered": 0},
        "low": {"succeeded": 0, "failed": 1, "dead_lettered": 0},
        Settings().queue: {"succeeded": 1, "failed": 0, "dead_lettered": 0}}
    assert h.settlement.counts == h.counts(succeeded=3, failed=1, retried=1, lock_lost=1)


def test_a_refused_cancellation_counts_as_a_lost_lease_not_a_cancel() -> None:
    h = Harness()
    rt = h.finished(1)
    rt.keeper.lease.refuse = LeaseLost("lock lost")
    cancel = type("C", (), {"who": "ops", "when": 0.0, "reason": "r"})()
    h.settlement.cancelled(rt.keeper, rt.task_id, 1, cancel_reason(cancel), "", 1)
    assert settled(rt.keeper)[0][0] == "dead_letter"
    h.settlement.prune()
    assert h.settlement.counts == h.counts(lock_lost=1)


# --------------------------------------------------------------------------- retry
@pytest.mark.parametrize(("attempt", "delay"), [(1, 10.0), (2, 20.0), (4, 80.0), (7, 600.0)])
def test_failure_is_released_with_exponential_backoff(attempt: int, delay: float) -> None:
    h = Harness(max_attempts=10)
    assert h.conclude(1, attempt=attempt) == [("release", True, delay)]
    assert h.settlement.counts == h.counts(retried=1)


def test_released_message_is_awaited_until_its_delay_has_passed() -> None:
    h = Harness()
    h.clock.now = T0 + 5
    rt = h.finished(1)
    h.settlement.conclude(rt, h.clock.now, stopping=False)
    assert settled(rt.keeper) == [("release", True, 10.0)]
    assert h.settlement.awaiting_return["t1"][1:] == (10.0, "released")
    assert not h.settlement.all_back_by(T0 + 5 + 10.0 - 0.01)
    assert h.settlement.all_back_by(T0 + 5 + 10.0)


# --------------------------------------------------------------------------- failed for good
def test_last_attempt_is_dead_lettered_with_reason_tail_and_status() -> None:
    h = Harness()
    calls = h.conclude(2, attempt=3, output="boom\n")
    assert calls == [("dead_letter", "exit status 2; attempt 3 of 3, giving up", "boom\n", 2)]
    assert h.settlement.counts == h.counts(failed=1)
    assert h.settlement.awaiting_return == {}


@pytest.mark.parametrize(("own", "attempt", "verb"), [(1, 1, "dead_letter"), (5, 3, "release")])
def test_the_message_own_max_attempts_wins(own: int, attempt: int, verb: str) -> None:
    h = Harness(max_attempts=3)
    calls = h.conclude(1, attempt=attempt, task=Task(cmd="false", max_attempts=own))
    assert calls[0][0] == verb


def test_time_limit_is_named_and_never_counts_as_success() -> None:
    h = Harness()
    assert h.conclude(0, attempt=1, term_reason="time limit") == [("release", True, 10.0)]
    calls = h.conclude(-signal.SIGTERM, attempt=3, term_reason="time limit")
    assert calls == [("dead_letter", "time limit 30s exceeded (killed by SIGTERM); "
                      "attempt 3 of 3, giving up", "", -signal.SIGTERM)]


def test_the_guard_words_a_failure_nobody_asked_for() -> None:
    h = Harness(guard=TaskGuard(limits=TaskLimits(cpu=5)))
    calls = h.conclude(-signal.SIGXCPU, attempt=3)
    assert calls[0][1] == ("cpu limit of 5s exceeded (killed by SIGXCPU); "
                           "attempt 3 of 3, giving up")


def test_failed_spawn_goes_through_the_same_rule() -> None:
    h = Harness()
    retry = make_task(h.clock).keeper
    h.settlement.failed(retry, "t1", 1, 3, "cannot start: ENOENT", "", None)
    assert settled(retry) == [("release", True, 10.0)]
    last = make_task(h.clock, "t2").keeper
    h.settlement.failed(last, "t2", 3, 3, "cannot start: ENOENT", "", None)
    assert settled(last) == [("dead_letter", "cannot start: ENOENT; attempt 3 of 3, giving up",
                              "", None)]
    assert h.settlement.counts == h.counts(retried=1, failed=1)


# --------------------------------------------------------------------------- requeue
@pytest.mark.parametrize("rc", [-signal.SIGTERM, -signal.SIGKILL, 1])
def test_task_asked_to_stop_is_requeued_without_counting_the_attempt(rc: int) -> None:
    h = Harness()
    assert h.conclude(rc, attempt=3, stop_reason="preempted") == [("release", False, 0.0)]
    assert h.settlement.counts == h.counts(requeued=1)
    assert h.settlement.awaiting_return == {}


@pytest.mark.parametrize("rc", [-signal.SIGTERM, 128 + signal.SIGTERM])
def test_sigterm_while_the_worker_stops_is_a_requeue(rc: int) -> None:
    """The task got the SIGTERM from outside (e.g. systemd signals the whole unit) before the
    watchdog asked: still a preemption, not a failure."""
    h = Harness()
    assert h.conclude(rc, stopping=True) == [("release", False, 0.0)]
    assert h.settlement.counts == h.counts(requeued=1)


def test_outside_sigterm_while_running_is_a_failure() -> None:
    h = Harness()
    assert h.conclude(-signal.SIGTERM, stopping=False) == [("release", True, 10.0)]
    calls = h.conclude(-signal.SIGTERM, stopping=False, attempt=3)
    assert calls == [("dead_letter", "killed by SIGTERM; attempt 3 of 3, giving up", "",
                      -signal.SIGTERM)]
    assert h.conclude(1, stopping=True) == [("release", True, 10.0)]  # not a SIGTERM
    assert h.settlement.counts == h.counts(retried=2, failed=1)


# --------------------------------------------------------------------------- lock lost
@pytest.mark.parametrize("how", ["watchdog acted", "keeper event", "deadline passed"])
def test_lost_lease_is_left_alone_and_awaited_from_its_expiry(how: str) -> None:
    h = Harness()
    rt = h.finished(0, granted=60.0)
    if how == "watchdog acted":
        rt.lock_loss_handled = True
    elif how == "keeper event":
        rt.keeper.lock_lost.set()
    else:
        h.clock.now = rt.keeper.deadline
    h.settlement.conclude(rt, h.clock.now, stopping=False)
    assert rt.keeper.done.is_set()  # nothing to settle: done at once
    assert settled(rt.keeper) == []
    assert h.settlement.counts == h.counts(lock_lost=1)
    back = rt.keeper.expires + RETURN_DELAY + 1.0  # + poll_interval
    assert h.settlement.awaiting_return["t1"][1:] == (RETURN_DELAY + 1.0, "lost")
    assert not h.settlement.all_back_by(back - 0.01)
    assert h.settlement.all_back_by(back)


# --------------------------------------------------------------------------- reject
def reject(h: Harness, lease: FakeLease, max_attempts: int = 3) -> tuple[bool, LeaseKeeper]:
    keeper = make_task(h.clock, lease=lease).keeper
    return h.settlement.reject(lease, keeper, "t1", max_attempts), keeper


def test_poison_message_is_dead_lettered_with_its_body() -> None:
    h = Harness()
    rejected, keeper = reject(h, FakeLease(task=None, format_error="not JSON",
                                           raw_body="x" * 3000))
    assert rejected
    assert settled(keeper) == [("dead_letter", "bad message: not JSON", "x" * 2000, None)]
    assert h.settlement.counts == h.counts(dead_lettered=1)


def test_refused_task_is_dead_lettered_without_a_run() -> None:
    h = Harness(guard=TaskGuard(allowed=re.compile(r"echo .*")))
    rejected, keeper = reject(h, FakeLease(task=Task(cmd="rm -rf /tmp/x")))
    assert rejected
    assert settled(keeper) == [("dead_letter", "command not allowed (--allowed-commands)", "",
                                None)]
    assert h.settlement.counts == h.counts(dead_lettered=1)


def test_exhausted_attempts_fail_without_a_run() -> None:
    h = Harness()
    rejected, keeper = reject(h, FakeLease(task=Task(cmd="true"), attempt=4))
    assert rejected
    assert settled(keeper) == [("dead_letter", "attempts exhausted (3 of 3 used)", "", None)]
    assert h.settlement.counts == h.counts(failed=1)


def test_runnable_task_is_not_rejected() -> None:
    h = Harness(guard=TaskGuard(allowed=re.compile(r"echo .*")))
    lease = FakeLease(task=Task(cmd="echo hi"), attempt=3)
    rejected, keeper = reject(h, lease)
    assert not rejected
    assert not keeper.done.is_set() and lease.calls == []
    assert h.settlement.counts == h.counts()


# --------------------------------------------------------------------------- failure streak
def test_failure_streak_is_reported_from_the_limit_on_and_reset_by_a_success() -> None:
    h = Harness(max_consecutive_failures=2, max_attempts=10)
    for rc, streaks in [(1, []), (0, []), (1, []), (-signal.SIGTERM, [2]), (1, [2, 3])]:
        h.conclude(rc)
        assert h.streaks == streaks, rc


def test_no_streak_without_the_limit() -> None:
    h = Harness(max_consecutive_failures=0, max_attempts=10)
    for _ in range(5):
        h.conclude(1)
    assert h.streaks == []
