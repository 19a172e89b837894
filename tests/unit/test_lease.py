"""LeaseKeeper driven step by step with a fake clock and a fake lease.

The rule under test: docs/architecture.rst, section "The lease deadline rule"."""

from __future__ import annotations

import threading
import time

import pytest

from supervisor.backends.base import BackendError, LeaseLost
from supervisor.core.settings import safety_margin
from supervisor.worker.keeper import (
    RETRY_AFTER_FAILURE,
    SETTLE_LAST_TRY,
    SETTLE_RETRY_MAX,
    LeaseKeeper,
    lease_deadline,
    next_renewal,
)
from supervisor.worker.outcomes import Ended, SettleResult, Unsettled
from supervisor.worker.settle_steps import Complete, DeadLetter, Release
from tests.fakes.clock import FakeClock
from tests.fakes.lease import ScriptedLease

pytestmark = pytest.mark.timeout(10)

T0 = 1000.0
LOCK = 60.0
MARGIN = safety_margin(LOCK)  # 6 s
INTERVAL = 20.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def lease(clock: FakeClock) -> ScriptedLease:
    return ScriptedLease(clock, LOCK)


class Lost:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


@pytest.fixture
def on_lost() -> Lost:
    return Lost()


@pytest.fixture
def keeper(lease: ScriptedLease, clock: FakeClock, on_lost: Lost) -> LeaseKeeper:
    return LeaseKeeper(lease, "task-1", t_sent=T0, granted=LOCK, renew_interval=INTERVAL,
                       clock=clock, on_lost=on_lost, sleep=clock.advance)


# --------------------------------------------------------------------------- renewals
def test_initial_deadline(keeper: LeaseKeeper) -> None:
    assert MARGIN == 6.0
    assert keeper.deadline == T0 + LOCK - MARGIN
    assert keeper.next_renew == T0 + INTERVAL
    assert not keeper.lock_lost.is_set()
    assert not keeper.lost()


def test_the_deadline_and_renewal_formulas() -> None:
    assert lease_deadline(T0, LOCK) == T0 + LOCK - MARGIN
    assert next_renewal(T0, LOCK, INTERVAL) == T0 + INTERVAL
    # a short grant: renewed halfway to its deadline, not at the usual interval
    assert next_renewal(T0, 12.0, INTERVAL) == T0 + (12.0 - safety_margin(12.0)) / 2


def test_no_renewal_before_next_renew(keeper, lease, clock) -> None:
    for t in (T0, T0 + 1, T0 + INTERVAL - 0.001):
        clock.now = t
        keeper.step()
    assert lease.renews == []
    clock.now = T0 + INTERVAL
    keeper.step()
    assert len(lease.renews) == 1


def test_successful_renewal_moves_deadline_from_send_time(keeper, lease, clock) -> None:
    clock.now = T0 + INTERVAL
    lease.call_duration = 5.0  # a slow call: returns at T0 + 25
    keeper.step()
    t_sent = T0 + INTERVAL
    assert keeper.renewals == 1
    assert keeper.deadline == t_sent + LOCK - MARGIN  # not the return time + LOCK - MARGIN
    assert keeper.next_renew == t_sent + INTERVAL
    assert clock.now == t_sent + 5.0


def test_renewal_uses_the_granted_lock(keeper, lease, clock) -> None:
    clock.now = T0 + INTERVAL
    lease.outcomes = [30.0]  # the broker gave a shorter lock this time
    keeper.step()
    assert keeper.deadline == T0 + INTERVAL + 30.0 - safety_margin(30.0)
    assert keeper.granted == 30.0


@pytest.mark.parametrize("at", [T0 + INTERVAL, T0 + 30.0, T0 + 45.0, T0 + 53.0, T0 + 53.99])
def test_renew_timeout_fits_before_the_deadline(keeper, lease, clock, at: float) -> None:
    keeper.next_renew = at  # as if earlier attempts had failed
    clock.now = at
    deadline_before = keeper.deadline
    keeper.step()
    ((called_at, timeout),) = lease.renews
    assert called_at == at
    assert 0 < timeout <= deadline_before - at


def test_backend_error_keeps_deadline_and_retries_soon(keeper, lease, clock, on_lost) -> None:
    clock.now = T0 + INTERVAL
    lease.outcomes = [BackendError("timeout")]
    old_deadline = keeper.deadline
    keeper.step()
    assert keeper.deadline == old_deadline
    assert keeper.failures == 1
    assert not keeper.lock_lost.is_set()
    assert on_lost.calls == 0
    assert clock.now < keeper.next_renew <= clock.now + RETRY_AFTER_FAILURE
    assert keeper.next_renew < T0 + 2 * INTERVAL  # much sooner than the normal cadence
    # the retry happens at next_renew, and a success then moves the deadline
    clock.now = keeper.next_renew - 0.001
    keeper.step()
    assert len(lease.renews) == 1
    clock.now = keeper.next_renew
    retry_sent = clock.now
    keeper.step()
    assert len(lease.renews) == 2
    assert keeper.deadline == retry_sent + LOCK - MARGIN


def test_slow_backend_error_still_retries_soon(keeper, lease, clock) -> None:
    clock.now = T0 + INTERVAL
    lease.call_duration = 4.0
    lease.outcomes = [BackendError("slow")]
    keeper.step()
    assert keeper.deadline == T0 + LOCK - MARGIN
    assert clock.now < keeper.next_renew <= clock.now + RETRY_AFTER_FAILURE


def test_lease_lost_sets_lock_lost_at_once(keeper, lease, clock, on_lost) -> None:
    clock.now = T0 + INTERVAL
    lease.outcomes = [LeaseLost("410 gone")]
    keeper.step()
    assert keeper.lock_lost.is_set()
    assert on_lost.calls == 1
    assert "410 gone" in keeper.lost_reason
    assert keeper.lost()
    # no more renewals once lost, and on_lost is not called again
    clock.now = T0 + 2 * INTERVAL
    keeper.step()
    assert len(lease.renews) == 1
    assert on_lost.calls == 1


def test_deadline_passing_sets_lock_lost_without_renewing(keeper, lease, clock, on_lost) -> None:
    clock.now = T0 + INTERVAL
    lease.outcomes = [BackendError("down")] * 100
    while clock.now < keeper.deadline:
        clock.now = max(clock.now, keeper.next_renew)
        if clock.now >= keeper.deadline:
            break
        keeper.step()
    calls = len(lease.renews)
    assert calls >= 2
    assert not keeper.lock_lost.is_set()
    assert keeper.deadline == T0 + LOCK - MARGIN
    clock.now = keeper.deadline
    keeper.step()
    assert keeper.lock_lost.is_set()
    assert on_lost.calls == 1
    assert len(lease.renews) == calls  # no renew call once the deadline has passed
    assert "deadline" in keeper.lost_reason


def test_lost_reports_deadline_even_without_a_step(keeper, clock) -> None:
    clock.now = keeper.deadline - 0.001
    assert not keeper.lost()
    clock.now = keeper.deadline
    assert keeper.lost()


# --------------------------------------------------------------------------- settlement
def _settle_completed(keeper: LeaseKeeper, lease: ScriptedLease, errors: list | None = None,
                      duration: float = 0.0) -> list[float]:
    """Finish the task as completed and run the settlement, the fake lease's calls raising
    ``errors`` first and each taking ``duration``; the clock at each call."""
    if errors is not None:
        lease.settle_errors = errors
    lease.settle_duration = duration
    keeper.finish(Complete(), Ended.SUCCEEDED)
    keeper.settle()
    return lease.settle_calls


def test_settle_runs_the_settlement(keeper, lease) -> None:
    _settle_completed(keeper, lease)
    assert lease.settled == ["complete"]
    assert keeper.result == SettleResult(Ended.SUCCEEDED)


@pytest.mark.parametrize("step, call", [
    (Complete(), "complete"),
    (Release(count_attempt=False), "release(False, 0)"),
    (Release(count_attempt=True, delay=20.0), "release(True, 20)"),
    (DeadLetter("exit status 1", "tail", 1), "dead_letter(exit status 1, tail, 1)"),
    (DeadLetter("bad message: not JSON"), "dead_letter(bad message: not JSON, , None)"),
])
def test_each_step_is_one_call_on_the_lease(keeper, lease, step, call) -> None:
    keeper.finish(step, Ended.FAILED)
    keeper.settle()
    assert lease.settled == [call]
    assert lease.renews == []


@pytest.mark.parametrize("why", ["lost", "past the deadline"])
def test_settle_skipped_when_lost_or_past_the_deadline(keeper, lease, clock, why) -> None:
    if why == "lost":
        keeper.lock_lost.set()
    else:
        clock.now = keeper.deadline + 0.5
    _settle_completed(keeper, lease)
    assert lease.settled == []
    assert keeper.result is not None and keeper.result.refused


def test_settle_retries_backend_errors_until_success(keeper, lease, clock) -> None:
    attempts = _settle_completed(keeper, lease, [BackendError("busy")] * 3, duration=0.5)
    assert len(attempts) == 4
    assert lease.settled == ["complete"]
    assert keeper.result == SettleResult(Ended.SUCCEEDED)
    assert not keeper.lock_lost.is_set()


def test_settle_gives_up_when_the_deadline_passes_while_retrying(keeper, lease, clock) -> None:
    lease.outcomes = [BackendError("down")] * 100  # the renewals fail too: an outage
    attempts = _settle_completed(keeper, lease, [BackendError("down")] * 100, duration=10.0)
    # each call takes 10 s; the waits between them double from 1 s and never pass the last
    # try, SETTLE_LAST_TRY before the deadline at T0+54: calls at T0, +11, +23, +37, +53
    assert attempts == [T0, T0 + 11, T0 + 23, T0 + 37, T0 + 54 - SETTLE_LAST_TRY]
    assert keeper.result is not None and keeper.result.unsettled is Unsettled.UNREACHABLE
    assert "unreachable" in keeper.result.reason and "refused" not in keeper.result.reason


class OutageLease(ScriptedLease):
    """Every call (renewal or settlement) fails with a BackendError before ``back_at``."""

    def __init__(self, clock: FakeClock, back_at: float) -> None:
        super().__init__(clock)
        self.back_at = back_at

    def renew(self, timeout: float) -> float:
        if self.clock.now < self.back_at:
            self.renews.append((self.clock.now, timeout))
            raise BackendError("connection timed out")
        return super().renew(timeout)

    def _settle(self, what: str) -> None:
        if self.clock.now < self.back_at:
            self.settle_calls.append(self.clock.now)
            raise BackendError("connection timed out")
        super()._settle(what)


def _outage_keeper(clock: FakeClock, lease: ScriptedLease, sleeps: list) -> LeaseKeeper:
    def sleep(seconds: float) -> None:
        sleeps.append((clock.now, seconds))
        clock.advance(seconds)
    return LeaseKeeper(lease, "task-1", t_sent=T0, granted=LOCK, renew_interval=INTERVAL,
                       clock=clock, sleep=sleep)


def test_settle_retry_schedule_never_sleeps_past_the_deadline(clock) -> None:
    """Issue 26: an outage longer than the first back-off steps.  No wait crosses the
    deadline (the old schedule slept 16 s into it and never tried again); the last try is
    sent SETTLE_LAST_TRY before it; the outcome says unreachable, not refused."""
    lease = OutageLease(clock, back_at=T0 + 3600)
    sleeps: list[tuple[float, float]] = []
    keeper = _outage_keeper(clock, lease, sleeps)
    deadline = keeper.deadline
    keeper.finish(Complete(), Ended.SUCCEEDED)
    keeper.settle()
    assert sleeps and all(at + d <= deadline - SETTLE_LAST_TRY for at, d in sleeps)
    assert lease.settle_calls[:6] == [T0, T0 + 1, T0 + 3, T0 + 7, T0 + 15, T0 + 31]
    assert lease.settle_calls[-1] == deadline - SETTLE_LAST_TRY  # one last try just before
    assert lease.renews, "the lease was not renewed while the settlement waited"
    assert keeper.result is not None and keeper.result.unsettled is Unsettled.UNREACHABLE
    assert not keeper.lock_lost.is_set()
    assert keeper.result.reason.startswith(
        "could not settle: the service was unreachable until the lease ended")


def test_a_waiting_settlement_renews_and_goes_through_when_the_service_answers(clock) -> None:
    """The service is back 4 s before the deadline: the next renewal succeeds, extends the
    lease, and the settlement is tried at once -- it goes through (issue 26)."""
    lease = OutageLease(clock, back_at=T0 + 50)
    keeper = _outage_keeper(clock, lease, [])
    keeper.finish(Complete(), Ended.SUCCEEDED)
    keeper.settle()
    assert lease.settled == ["complete"]
    assert keeper.result == SettleResult(Ended.SUCCEEDED)
    assert T0 + 50 <= lease.settle_calls[-1] < T0 + 50 + RETRY_AFTER_FAILURE
    assert keeper.renewals == 1 and keeper.deadline > T0 + 100


@pytest.mark.parametrize("applied", [True, False])
def test_a_renewal_refused_while_settling_leaves_the_last_word_to_the_settlement(
        keeper, lease, clock, applied) -> None:
    """A refused renewal may mean that the failed settlement call was applied after all:
    one more try lets the backend tell (done), or confirms the lease is gone (refused)."""
    lease.outcomes = [LeaseLost("message not found")]
    errors: list = [BackendError("timed out")] * 5
    _settle_completed(keeper, lease, errors + ([None] if applied else [LeaseLost("gone")]))
    if applied:
        assert lease.settled == ["complete"] and keeper.result == SettleResult(Ended.SUCCEEDED)
    else:
        assert keeper.lock_lost.is_set()
        assert keeper.result is not None and keeper.result.unsettled is Unsettled.REFUSED
        assert "refused" in keeper.result.reason


def test_settle_retries_back_off_up_to_a_cap(lease, clock, on_lost) -> None:
    """A long outage: waits double from 1 s up to SETTLE_RETRY_MAX, not a call a second."""
    keeper = LeaseKeeper(lease, "task-1", t_sent=T0, granted=3600.0, renew_interval=600.0,
                         clock=clock, on_lost=on_lost, sleep=clock.advance)
    calls = _settle_completed(keeper, lease, [BackendError("down")] * 9)
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert gaps == [1, 2, 4, 8, 16, SETTLE_RETRY_MAX, SETTLE_RETRY_MAX, SETTLE_RETRY_MAX,
                    SETTLE_RETRY_MAX]
    assert lease.settled == ["complete"]


def test_settle_lease_lost_is_not_retried(keeper, lease, on_lost) -> None:
    attempts = _settle_completed(keeper, lease, [LeaseLost("token mismatch")] * 2)
    assert len(attempts) == 1
    assert keeper.lock_lost.is_set()
    assert on_lost.calls == 1
    assert keeper.result is not None and keeper.result.refused


def test_finish_none_settles_nothing(keeper, lease) -> None:
    keeper.finish(None, Ended.LOCK_LOST)
    keeper.settle()
    assert lease.settled == []
    assert lease.renews == []


# --------------------------------------------------------------------------- the thread
class ThreadLease:
    """Thread-safe fake for the real keeper thread; real time, tiny intervals."""

    def __init__(self, wanted: int) -> None:
        self.lock = threading.Lock()
        self.timeouts: list[float] = []
        self.settled: list[str] = []
        self.enough = threading.Event()
        self.wanted = wanted

    def renew(self, timeout: float) -> float:
        with self.lock:
            self.timeouts.append(timeout)
            if len(self.timeouts) >= self.wanted:
                self.enough.set()
        return 30.0

    def complete(self) -> None:
        with self.lock:
            self.settled.append("complete")


def _keeper_thread(wanted: int, renew_interval: float) -> tuple[ThreadLease, LeaseKeeper]:
    """A keeper of a 30 s lock, its thread started, on a ThreadLease awaiting ``wanted``
    renewals."""
    lease = ThreadLease(wanted=wanted)
    keeper = LeaseKeeper(lease, "thread-task", t_sent=time.monotonic(), granted=30.0,
                         renew_interval=renew_interval)
    keeper.start()
    return lease, keeper


@pytest.mark.timeout(15)
def test_keeper_thread_renews_and_settles() -> None:
    lease, keeper = _keeper_thread(wanted=3, renew_interval=0.01)
    try:
        assert lease.enough.wait(5.0), "fewer than 3 renewals within 5 s"
        assert keeper.renewals >= 3
        assert not keeper.lock_lost.is_set()
        assert all(0 < t <= 30.0 for t in lease.timeouts)
        assert keeper.deadline > time.monotonic()
    finally:
        keeper.finish(Complete(), Ended.SUCCEEDED)
        assert keeper.join(5.0)
    assert lease.settled == ["complete"]
    assert keeper.done.is_set()
    assert keeper.result == SettleResult(Ended.SUCCEEDED)


@pytest.mark.timeout(15)
def test_keeper_thread_finish_none_stops_without_settling() -> None:
    lease, keeper = _keeper_thread(wanted=1, renew_interval=60.0)
    keeper.finish(None, Ended.LOCK_LOST)
    assert keeper.join(5.0)
    assert lease.settled == []
    assert lease.timeouts == []


# ------------------------------------------------- settling on the calling thread (SQLite)
def test_settle_here_settles_without_a_thread(keeper, lease, clock) -> None:
    keeper.finish(Complete(), Ended.SUCCEEDED)
    clock.advance(1.0)
    assert keeper.settle_here() == SettleResult(Ended.SUCCEEDED)
    assert lease.settled == ["complete"]
    assert keeper.done.is_set() and keeper.started  # start() is a no-op from now on
    assert keeper.finished_at == T0 + 1.0
    assert keeper.result == SettleResult(Ended.SUCCEEDED)


def test_settle_here_leaves_a_busy_backend_to_the_thread(keeper, lease) -> None:
    lease.settle_errors = [BackendError("database is locked")]

    keeper.finish(Complete(), Ended.SUCCEEDED)
    assert keeper.settle_here() is None
    assert not keeper.started and not keeper.done.is_set()
    keeper.settle()  # what the keeper thread then does: it retries
    assert lease.settled == ["complete"]


def test_settle_here_lease_lost(keeper, lease, on_lost) -> None:
    lease.settle_errors = [LeaseLost("token mismatch")]

    keeper.finish(Complete(), Ended.SUCCEEDED)
    result = keeper.settle_here()
    assert result is not None and result.unsettled is Unsettled.REFUSED
    assert keeper.lock_lost.is_set() and on_lost.calls == 1
    assert keeper.result is not None and keeper.result.refused
    assert keeper.done.is_set()


def test_settle_here_not_past_the_deadline_nor_beside_a_running_thread(
        keeper, lease, clock) -> None:
    keeper.finish(Complete(), Ended.SUCCEEDED)
    clock.advance(LOCK)  # past the deadline: the thread logs it and settles nothing
    assert keeper.settle_here() is None
    assert lease.settled == []
    other = LeaseKeeper(ScriptedLease(clock, LOCK), "task-2", t_sent=clock.now, granted=LOCK,
                        renew_interval=INTERVAL, clock=clock)
    other.started = True  # its thread runs: only that thread may touch the lease
    other.finish(Complete(), Ended.SUCCEEDED)
    assert other.settle_here() is None


def test_an_unexpected_error_in_a_settlement_is_retried(keeper, lease, clock) -> None:
    """A client library's own bug (the Storage Queue SDK once raised RuntimeError from a
    race in its model cache) must not leave the lease unsettled."""
    lease.settle_errors = [RuntimeError("dictionary changed size during iteration")]
    calls = lease.settle_calls

    keeper.finish(Complete(), Ended.SUCCEEDED)
    keeper.settle()  # the keeper thread's part: the error is logged and the call retried
    assert lease.settled == ["complete"] and len(calls) == 2
    assert keeper.result == SettleResult(Ended.SUCCEEDED)
    lease2 = ScriptedLease(clock, LOCK)
    lease2.settle_errors = [RuntimeError("dictionary changed size during iteration")]
    keeper2 = LeaseKeeper(lease2, "task-2", t_sent=clock.now, granted=LOCK,
                          renew_interval=INTERVAL, clock=clock)
    keeper2.finish(Complete(), Ended.SUCCEEDED)
    assert keeper2.settle_here() is None  # on the main loop: left to the thread, which retries


def test_an_unexpected_error_in_a_renewal_counts_as_a_failed_renewal(keeper, lease, clock):
    lease.outcomes = [RuntimeError("bug"), None]
    clock.advance(INTERVAL)
    keeper.step()
    assert keeper.failures == 1 and not keeper.lock_lost.is_set()
    clock.advance(RETRY_AFTER_FAILURE)
    keeper.step()
    assert keeper.renewals == 1 and keeper.deadline == clock.now + LOCK - MARGIN
