"""The worker's side of fleet control without processes: the watchdog carrying out a cancel,
settlement of a cancelled task, and the control agent's poll/heartbeat/back-off against a
real SQLite control store (a fake one only where a store must fail), with injected clocks."""

from __future__ import annotations

import logging
import queue
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from test_settlement import Harness, settled

from supervisor.core.signing import SigningKey, key_id
from supervisor.fleet.agent import BACKOFF_MAX, LOG_EVERY, ControlAgent
from supervisor.fleet.control import (
    Cancel,
    Command,
    ControlSnapshot,
    ControlStoreError,
    QueueFlag,
    ResultRecord,
    new_seq,
)
from supervisor.fleet.control.signing import sign
from supervisor.fleet.control.sqlite import SqliteControlStore
from supervisor.worker.events import ControlRequest
from supervisor.worker.watchdog import Escalation
from tests.conftest import wait_for
from tests.fakes.clock import FakeClock
from tests.fakes.lease import FakeLease
from tests.fakes.worker import make_dog, make_task, run_until

pytestmark = pytest.mark.timeout(30)

T0 = 5000.0
TERM, KILL = signal.SIGTERM, signal.SIGKILL


def cancel(task_id: str = "t1", grace: float = 30.0, when: float = 1e9) -> Cancel:
    return Cancel(queue="q", task_id=task_id, reason="why", who="ops", when=when, grace=grace)


# ------------------------------------------------------------------------------ watchdog
def test_cancel_terms_the_task_then_kills_it_at_its_own_grace() -> None:
    clock = FakeClock(T0)
    dog = make_dog(clock, kill_timeout=600.0)
    rt = make_task(clock)
    dog.add(rt)
    dog.tick()
    clock.now = T0 + 1
    rt.cancel = cancel(grace=5.0)
    dog.tick()
    assert dog.signals() == [(TERM, T0 + 1)]
    assert rt.cancel_handled and rt.term_reason == "cancelled"
    run_until(dog, clock, T0 + 6 - 1e-6, step=0.5)
    assert dog.signals() == [(TERM, T0 + 1)]
    clock.now = T0 + 6
    dog.tick()
    assert dog.signals() == [(TERM, T0 + 1), (KILL, T0 + 6)]
    run_until(dog, clock, T0 + 100)
    assert len(dog.sent) == 2


def test_cancel_now_kills_at_once_even_with_escalation_off() -> None:
    clock = FakeClock(T0)
    dog = make_dog(clock, kill_timeout=0.0)
    rt = make_task(clock)
    dog.add(rt)
    rt.cancel = cancel(grace=0.0)
    dog.tick()
    assert dog.signals() == [(KILL, T0)]
    assert rt.state is Escalation.KILLED


def test_cancel_while_stopping_shortens_the_wait_never_lengthens_it() -> None:
    clock = FakeClock(T0)
    dog = make_dog(clock, kill_timeout=0.0)  # a stop alone never escalates
    rt = make_task(clock)
    dog.add(rt)
    rt.stop_reason = "preempted"
    dog.tick()
    clock.now = T0 + 2
    rt.cancel = cancel(grace=3.0)
    run_until(dog, clock, T0 + 20)
    assert dog.signals() == [(TERM, T0), (KILL, T0 + 5)]


def test_an_exited_task_is_not_cancelled() -> None:
    clock = FakeClock(T0)
    dog = make_dog(clock)
    rt = make_task(clock)
    dog.add(rt)
    rt.exited_at = T0
    rt.cancel = cancel(grace=0.0)
    dog.tick()
    assert dog.signals() == [] and not rt.cancel_handled


# ---------------------------------------------------------------------------- settlement
def test_cancelled_task_is_failed_with_who_and_why_never_retried_nor_counted_failed() -> None:
    h = Harness(max_attempts=5, max_consecutive_failures=1)
    seen: list = []
    h.settlement.results.sink = seen.append
    rt = h.finished(-15, output="tail\n", cancel=cancel(), cancel_handled=True,
                    term_reason="cancelled")
    h.settlement.conclude(rt, h.clock.now, stopping=False)
    ((verb, reason, tail, rc),) = settled(rt.keeper)
    assert (verb, tail, rc) == ("dead_letter", "tail\n", -15)
    assert reason.startswith("cancelled by ops at 2001-09-09T01:46:40Z: why")
    assert h.settlement.counts == h.counts(cancelled=1)
    assert h.streaks == [] and h.settlement.consecutive_failures == 0
    assert [(r.task_id, r.attempt, r.outcome, r.reason, r.tail, r.exit_status, r.signal,
             r.cancelled_by) for r in seen] == [("t1", 1, "cancelled", reason, "tail\n",
                                                 None, 15, "ops")]


def test_a_cancel_the_task_outran_is_settled_by_its_exit() -> None:
    h = Harness()
    assert h.conclude(0, cancel=cancel()) == [("complete",)]  # never carried out
    assert h.settlement.counts == h.counts(succeeded=1)


# ------------------------------------------------------------------------------- agent
class Task_:
    cmd = "echo " + "x" * 300
    env = {"B_SECRET": "v", "A": "1"}


COUNTS = {"succeeded": 7, "failed": 2, "dead_lettered": 1, "retried": 5}


def agent_for(store: Any, clock: FakeClock, tasks: list | None = None, **kw: Any
              ) -> tuple[ControlAgent, queue.SimpleQueue, list[int]]:
    events: queue.SimpleQueue = queue.SimpleQueue()
    wakes: list[int] = []
    agent = ControlAgent(queue_name="q", worker_id="w1", opener=lambda: store,
                         on_paused=lambda paused: events.put(ControlRequest(paused=paused)),
                         on_command=lambda c: events.put(ControlRequest(command=c)),
                         wake_watchdog=lambda: wakes.append(1),
                         view=lambda: ("running", tuple(tasks or ()), 4, COUNTS), clock=clock,
                         **{"wall": lambda: 1e9 + clock.now - T0, "control_interval": 1.0,
                            "heartbeat_interval": 5.0, **kw})
    agent.store = store
    return agent, events, wakes


@pytest.fixture
def store(tmp_path: Path):
    s = SqliteControlStore(str(tmp_path / "q.db"))
    yield s
    s.close()


def test_heartbeat_record_lists_tasks_with_wall_clock_times(store) -> None:
    clock = FakeClock(T0)
    rt = make_task(clock, lease=FakeLease(), granted=60.0, attempt=2, task=Task_())
    clock.now = T0 + 10
    agent, _, _ = agent_for(store, clock, [rt])
    agent._heartbeat()
    (rec,) = store.workers("q")
    assert (rec.id, rec.state, rec.slots_used, rec.slots_total) == ("w1", "running", 1, 4)
    assert (rec.succeeded, rec.failed) == (7, 3), "finished for good; a retry is not"
    (info,) = rec.tasks
    assert (info.id, info.attempt, info.pid) == ("t1", 2, rt.proc.pid)
    assert info.started == pytest.approx(1e9)  # started 10 s ago by the monotonic clock
    assert info.lease_expires == pytest.approx(1e9 + 10 + rt.keeper.expires - clock.now)
    assert info.cmd == Task_.cmd[:200]
    assert info.env_names == ("A", "B_SECRET")  # names only, never values


def test_poll_applies_a_cancel_to_the_running_task_and_caches_the_rest(store) -> None:
    clock = FakeClock(T0)
    rt = make_task(clock)
    agent, _, wakes = agent_for(store, clock, [rt])
    store.put_cancel(cancel("t1"))
    store.put_cancel(cancel("not-yet-received"))
    agent._poll()
    assert rt.cancel == cancel("t1") and wakes == [1]
    assert set(agent.cancels) == {"t1", "not-yet-received"}
    agent._poll()  # a cancel already set is not set again
    assert wakes == [1]


def test_pause_flag_and_commands_go_to_the_main_loop(store) -> None:
    clock = FakeClock(T0)
    agent, events, _ = agent_for(store, clock)
    store.put_flag(QueueFlag(queue="q", paused=True, who="ops", when=1e9))
    old = Command(queue="q", worker="w1", seq=new_seq(1e9 - 100), action="stop", who="ops",
                  when=1e9 - 100)
    new = Command(queue="q", worker="w1", seq=new_seq(1e9 + 1), action="drain", who="ops",
                  when=1e9 + 1)
    for c in (old, new, Command(queue="q", worker="w2", seq=new_seq(1e9 + 1), action="stop",
                                who="ops", when=1e9 + 1)):
        store.put_command(c)
    agent._poll()
    agent._poll()  # the same command is not handed over twice
    got = []
    while not events.empty():
        got.append(events.get_nowait())
    assert got == [ControlRequest(paused=True), ControlRequest(command=new)]
    assert agent.paused and agent.record().state == "paused"
    agent.acted(new)
    agent._flush()  # the old one was acknowledged as obsolete, the new one once acted on
    assert store.poll("q", "w1").commands == ()


def test_with_keys_unsigned_records_are_ignored_and_logged_once(store, caplog) -> None:
    key = SigningKey(path="k", secret=b"s" * 32, kid=key_id(b"s" * 32))
    clock = FakeClock(T0)
    agent, events, _ = agent_for(store, clock, keys=[key])
    store.put_cancel(cancel("a"))
    store.put_cancel(sign(cancel("b"), key))
    store.put_flag(QueueFlag(queue="q", paused=True, who="ops", when=1e9))
    with caplog.at_level(logging.WARNING, "jobq.control"):
        agent._poll()
        agent.directives.cursor = None
        agent._poll()
    assert set(agent.cancels) == {"b"} and not agent.paused and events.empty()
    unsigned = [r for r in caplog.records if "signature unsigned" in r.getMessage()]
    assert len(unsigned) == 2  # the cancel and the flag, once each


class FailingStore:
    name = "failing"

    def __init__(self) -> None:
        self.down = True
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        if name == "watch":  # a store that cannot push (base.Watchable): polled only
            raise AttributeError(name)

        def call(*a: Any, **k: Any) -> Any:
            self.calls += 1
            if self.down:
                raise ControlStoreError("black-holed")
            return None
        return call


def test_outage_backs_off_logs_once_a_minute_and_recovery_once(caplog) -> None:
    clock = FakeClock(T0)
    store = FailingStore()
    agent, _, _ = agent_for(store, clock)
    backoffs = []
    with caplog.at_level(logging.INFO, "jobq.control"):
        for _ in range(12):
            try:
                agent._heartbeat()
            except ControlStoreError as exc:
                agent.outage.failed("call", exc)
            backoffs.append(agent.outage.backoff)
            clock.now += agent.outage.backoff
        store.down = False
        agent._heartbeat()
        agent.outage.succeeded()
    assert backoffs[:7] == [1, 2, 4, 8, 16, 32, 60] and max(backoffs) == BACKOFF_MAX
    warned = [r for r in caplog.records if "unavailable" in r.getMessage()]
    elapsed = clock.now - T0
    assert 1 <= len(warned) <= 1 + elapsed / LOG_EVERY
    assert len(warned) < 12
    assert [r.getMessage() for r in caplog.records if "again" in r.getMessage()] == [
        "control store reachable again after 12 failed call(s)"]


@pytest.mark.timing  # asserts a wall-clock bound
def test_the_thread_never_delays_stop_on_a_black_holed_store() -> None:
    class Hung(FailingStore):
        def __getattr__(self, name: str) -> Any:
            def call(*a: Any, **k: Any) -> Any:
                time.sleep(30)  # a call that never answers
            return call

    agent, _, _ = agent_for(Hung(), FakeClock(T0))
    agent.start()
    t0 = time.monotonic()
    assert not agent.wait_first_poll(0.2)
    agent.stop(clean=True)
    assert time.monotonic() - t0 < 7.0


def test_a_cancel_deleted_from_the_store_leaves_the_cache_within_a_refresh(store,
                                                                            tmp_path) -> None:
    import sqlite3

    from supervisor.fleet.directives import REFRESH_EVERY

    clock = FakeClock(T0)
    agent, _, _ = agent_for(store, clock)
    store.put_cancel(cancel("gone"))
    store.put_cancel(cancel("kept"))
    agent._poll()
    cache = agent.cancels
    with sqlite3.connect(tmp_path / "q.db") as conn:  # as a requeue that clears it would
        conn.execute("DELETE FROM control_records WHERE row LIKE 'cancel:gone'")
    conn.close()
    clock.now += REFRESH_EVERY - 1
    agent._poll()
    assert set(agent.cancels) == {"gone", "kept"}
    clock.now += 1
    agent._poll()
    assert set(agent.cancels) == {"kept"} and agent.cancels is cache


def test_a_cancelled_task_waiting_for_settlement_is_no_failure_streak() -> None:
    h = Harness(max_consecutive_failures=1)
    rt = h.finished(-15, cancel=cancel(), cancel_handled=True, term_reason="cancelled")
    rt.exited_at = h.clock.now
    assert not h.settlement.streak_may_end([rt])
    rt.cancel_handled = False  # the same exit without a cancel is a failure
    assert h.settlement.streak_may_end([rt])


def test_a_flapping_store_still_logs_once_a_minute(caplog) -> None:
    clock = FakeClock(T0)
    store = FailingStore()
    agent, _, _ = agent_for(store, clock)
    with caplog.at_level(logging.INFO, "jobq.control"):
        for _ in range(30):  # down for one call, up for the next, every 2 s for a minute
            agent.outage.failed("call", ControlStoreError("reset"))
            clock.now += 1
            agent.outage.succeeded()
            clock.now += 1
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unavailable" in m for m in messages) == 1
    assert sum("again" in m for m in messages) == 1


def test_a_wake_up_without_a_store_call_is_no_recovery_nor_a_reset_back_off(caplog) -> None:
    """Issue 26: the control thread, woken by a finished task during an outage, made no
    store call and declared the store "reachable again" (and reset its back-off); the line
    at the real recovery never came.  The real thread, with a clock that only the test
    moves: a pass is seen through the wall clock it reads at every pass's end."""
    class Store(FailingStore):
        def poll(self, *a: Any) -> ControlSnapshot:
            self.__getattr__("poll")()
            return ControlSnapshot(None, (), (), None)

    clock = FakeClock(T0)
    store = Store()
    passes = [0]

    def wall() -> float:
        passes[0] += 1
        return 1e9 + clock.now - T0

    agent, _, _ = agent_for(store, clock, wall=wall)
    record = ResultRecord(queue="q", task_id="t1", attempt=1, outcome="succeeded",
                          reason="", tail="", exit_status=0, worker="w1", when=1e9)
    with caplog.at_level(logging.INFO, "jobq.control"):
        agent.start()
        try:
            wait_for(lambda: store.calls >= 1, 10, what="the first (failing) call")
            seen = passes[0]
            agent.result(record)  # a task ended: the thread wakes, with nothing due yet
            wait_for(lambda: passes[0] > seen + 1, 10, what="a pass after the wake-up")
            assert store.calls == 1  # in the back-off: no call made ...
            assert not [r for r in caplog.records if "again" in r.getMessage()]  # ... so no
            assert agent.outage.backoff == 1.0 and agent.outage.failures == 1  # recovery
            clock.now += 1.0  # the back-off is over: the next call fails again, doubling it
            wait_for(lambda: store.calls >= 2, 10, what="the call after the back-off")
            wait_for(lambda: agent.outage.backoff == 2.0, 10, what="the doubled back-off")
            store.down = False
            clock.now += 2.0
            wait_for(lambda: [r for r in caplog.records if "again" in r.getMessage()], 10,
                     what="the recovery line")
        finally:
            agent.stop(clean=False)
    assert [r.getMessage() for r in caplog.records if "again" in r.getMessage()] == [
        "control store reachable again after 2 failed call(s)"]
    assert [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()][0] \
        .startswith("control store unavailable (call failed, 1 failure(s) so far; retrying "
                    "in 1s; tasks, leases and settlements are not affected)")


# ----------------------------------------------------------------------- pushed writes
class FakeWatch:
    """base.Watch whose push the test raises."""

    def __init__(self) -> None:
        self.flag = False
        self.closed = False

    def changed(self) -> bool:
        flag, self.flag = self.flag, False
        return flag

    def close(self) -> None:
        self.closed = True


class PushingStore(SqliteControlStore):
    """The real SQLite store, counting polls, with a push (base.Watchable) the test drives."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.polls = 0
        self.pushed = FakeWatch()

    def poll(self, *a: Any, **k: Any) -> ControlSnapshot:
        self.polls += 1
        return super().poll(*a, **k)

    def watch(self, queue: str, on_change: Any) -> FakeWatch:
        return self.pushed


def test_a_push_polls_at_once_but_not_in_a_back_off(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    store = PushingStore(str(tmp_path / "q.db"))
    try:
        agent, events, _ = agent_for(store, clock, control_interval=30.0)
        agent._start_watch()
        assert agent.watch is store.pushed
        agent._pass()
        clock.now += 1.0
        agent._pass()
        assert store.polls == 1  # the next poll is 30 s away
        store.put_flag(QueueFlag(queue="q", paused=True, who="ops", when=1e9))
        store.pushed.flag = True
        agent._pass()
        assert store.polls == 2 and events.get_nowait() == ControlRequest(paused=True)
        agent.outage.failed("call", "down")  # a back-off of 1 s: the push waits for its end
        store.pushed.flag = True
        agent._pass()
        assert store.polls == 2 and store.pushed.flag
        clock.now += 1.0
        agent._pass()
        assert store.polls == 3 and not store.pushed.flag
    finally:
        store.close()
