"""The Backend contract: what the worker and jobq-ctl rely on from every queue backend,
run against each of them through the Backend/Lease protocol alone (conftest.py: one ``Kit``
fixture per backend).

Where a backend legitimately differs, the test says so through the backend's capability flag
(``priorities``, ``max_delay``, ``no_retry_delay``) or the kit's declared ``Traits``, and
asserts the other behaviour instead of skipping.  Waits poll with deadlines; a BackendError
from ``receive`` is transient by the protocol, so the polls retry it as the worker's next turn
would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from supervisor.backends.base import (
    Backend,
    BackendConfigError,
    BackendError,
    Lease,
    LeaseLost,
    QueueStatus,
)
from supervisor.backends.multi import MultiQueueBackend
from supervisor.core.options import UsageError
from supervisor.core.task import Task
from supervisor.ctl.main import ctl_parser
from supervisor.ctl.push_command import push_schedule
from tests.conftest import wait_for

from .conftest import LOCK, WORKER, Kit

pytestmark = pytest.mark.timeout(90)

WAIT = 30.0  # s: the deadline of any one condition (generous: a busy machine)
SHORT = 1.0  # s: a lock meant to lapse (Storage Queue's shortest)
RENEW_LOCK = 3.0  # s: the lock of the renewal test, renewed for longer than that


# --------------------------------------------------------------------------- helpers
def receive_until(kit: Kit, backend: Backend, want: int = 1, lock: float = LOCK,
                  timeout: float = WAIT, stamps: list[float] | None = None) -> list[Lease]:
    """Receive on idle turns of the main loop until ``want`` leases came (at most ``want``).
    ``stamps``: the wall-clock time each lease was received at, in order."""
    got: list[Lease] = []

    def more() -> bool:
        kit.turn(backend)
        try:
            leases = list(backend.receive(want - len(got), lock))
        except BackendError:  # transient by the protocol: the next turn tries again
            return False
        got.extend(leases)
        if stamps is not None:
            stamps.extend(time.time() for _ in leases)
        return len(got) >= want

    wait_for(more, timeout, what=f"{want} lease(s) from {backend.name}")
    return got


def receive_now(kit: Kit, backend: Backend, n: int = 5, lock: float = LOCK) -> list[Lease]:
    """One answer of ``receive`` (a transient BackendError is asked again)."""
    answer: list[list[Lease]] = []

    def ask() -> bool:
        kit.turn(backend)
        try:
            answer.append(list(backend.receive(n, lock)))
        except BackendError:
            return False
        return True

    wait_for(ask, WAIT, what=f"an answer of {backend.name}'s receive")
    return answer[0]


def eventually(cond: Callable[[], object], what: str) -> None:
    """A count the service may tell late (Storage Queue's counts are approximate)."""
    wait_for(cond, WAIT, what=what)


def waiting(status: QueueStatus) -> int:
    """The waiting count of a ``status``: ``pending``, or ``queued`` where the counts cannot
    tell waiting from held messages (then the status says so in its note)."""
    if "pending" in status.counts:
        return status.counts["pending"]
    assert status.note, status
    return status.counts["queued"]


def ids(items: list[Task | str]) -> list[str]:
    return [t.id if isinstance(t, Task) else t for t in items]


def push_options(*args: str) -> object:
    """``jobq-ctl push`` options as its own parser reads them."""
    return ctl_parser().parse_args(["push", "-c", "true", *args])


# --------------------------------------------------------------------------- push, peek, size
def test_push_returns_the_ids_and_peek_and_size_see_the_tasks(backend: Backend) -> None:
    tasks = [Task(cmd="echo one", env={"A": "1"}), Task(cmd="echo two", cwd="/tmp"),
             Task(cmd="echo three", max_attempts=2)]
    assert backend.push(tasks) == [t.id for t in tasks]
    eventually(lambda: backend.size() == 3, "size 3")
    assert backend.peek(5) == tasks  # in push order, every field as pushed
    assert backend.peek(1) == tasks[:1]
    assert backend.peek(0) == []


# --------------------------------------------------------------------------- receive, renew
def test_receive_hands_each_task_out_once(kit: Kit) -> None:
    backend, other = kit.backend, kit.make(worker="w2")
    tasks = [Task(cmd=f"echo {i}", max_attempts=4) for i in range(3)]
    backend.push(tasks)
    leases = receive_until(kit, backend, want=3)
    by_id = {t.id: t for t in tasks}
    assert sorted(le.task.id for le in leases if le.task) == sorted(by_id)
    for lease in leases:
        assert lease.task is not None and lease.format_error is None
        assert lease.task == by_id[lease.task.id]  # max_attempts, env ... as pushed
        assert Task.parse(lease.raw_body) == lease.task
        assert lease.attempt == 1
        assert abs(lease.lock_duration - LOCK) <= 1.0
        assert lease.message_id
        if kit.traits.message_id_is_task_id:
            assert lease.message_id == lease.task.id
    assert len({le.message_id for le in leases}) == 3
    assert receive_now(kit, other) == []  # held: no other worker gets them
    assert receive_now(kit, backend) == []
    for lease in leases:
        lease.complete()
    eventually(lambda: backend.size() == 0, "size 0 after complete")
    assert receive_now(kit, other) == []
    assert backend.failed() == []


def test_renewal_keeps_the_lease_past_its_first_lock(kit: Kit) -> None:
    owner = kit.make(queue="renew", lock=RENEW_LOCK)
    other = kit.make(queue="renew", lock=RENEW_LOCK, worker="w2")
    owner.push([Task(cmd="long")])
    (lease,) = receive_until(kit, owner, lock=RENEW_LOCK)
    granted, keeper_pause = [], threading.Event()  # never set: the pause between renewals
    until = time.monotonic() + RENEW_LOCK + 1.5
    while time.monotonic() < until:  # like a LeaseKeeper: renew well within each lock
        granted.append(lease.renew(timeout=2.0))
        # the other worker's turn (SQLite: its reaper would take a lapsed lock back)
        assert receive_now(kit, other, lock=RENEW_LOCK) == []
        keeper_pause.wait(0.3)
    assert len(granted) >= 3
    assert all(abs(g - RENEW_LOCK) <= 1.0 for g in granted), granted
    lease.complete()
    eventually(lambda: owner.size() == 0, "size 0 after complete")
    assert receive_now(kit, other, lock=RENEW_LOCK) == []


def test_a_renewal_without_time_gives_up_and_keeps_the_lease(kit: Kit) -> None:
    backend = kit.backend
    backend.push([Task(cmd="x")])
    (lease,) = receive_until(kit, backend)
    with pytest.raises(BackendError) as info:
        lease.renew(timeout=0.0)
    assert not isinstance(info.value, LeaseLost)  # transient: nothing says the lease is gone
    assert abs(lease.renew(timeout=5.0) - LOCK) <= 1.0
    lease.complete()
    eventually(lambda: backend.size() == 0, "size 0 after complete")


def test_a_lapsed_lease_taken_by_another_is_lost(kit: Kit, request) -> None:
    kit.known_bug(request, "lapsed-lease-return")
    mine, theirs = kit.backend, kit.make(worker="w2")
    task = Task(cmd="x")
    mine.push([task])
    (lease,) = receive_until(kit, mine, lock=SHORT)
    kit.lapse()
    (again,) = receive_until(kit, theirs)  # back once its lock lapsed, to another worker
    assert again.task == task and again.attempt == 2
    assert again.message_id == lease.message_id
    with pytest.raises(LeaseLost):  # the renewal says so
        lease.renew(timeout=5.0)
    for settle in (lease.complete, lambda: lease.release(True),
                   lambda: lease.dead_letter("late", "")):
        with pytest.raises(LeaseLost):  # and nothing is settled through it afterwards
            settle()
    assert mine.failed() == []
    assert abs(again.renew(timeout=5.0) - LOCK) <= 1.0  # the new holder's lease is whole
    again.dead_letter("gave up", "some output", 3)
    (record,) = mine.failed()
    assert (record.id, record.reason, record.exit_status, record.attempts, record.output_tail,
            record.worker) == (task.id, "gave up", 3, 2, "some output", "w2")


def test_a_settled_lease_refuses_every_later_call(kit: Kit) -> None:
    backend = kit.backend
    backend.push([Task(cmd="x")])
    (lease,) = receive_until(kit, backend)
    lease.complete()
    for call in (lambda: lease.renew(5.0), lease.complete, lambda: lease.release(True),
                 lambda: lease.dead_letter("late", "")):
        with pytest.raises(LeaseLost):
            call()
    eventually(lambda: backend.size() == 0, "size 0 after complete")
    assert backend.failed() == []
    assert receive_now(kit, backend) == []


def test_a_preemption_after_the_lease_ended_sends_nothing(kit: Kit, request) -> None:
    kit.known_bug(request, "release-after-end")
    backend = kit.backend
    backend.push([Task(cmd="x")])
    (lease,) = receive_until(kit, backend)
    lease.complete()
    with pytest.raises(LeaseLost):
        lease.release(count_attempt=False)
    assert receive_now(kit, backend) == []  # no copy of the finished task


# --------------------------------------------------------------------------- release, failed
def test_release_with_and_without_the_attempt_then_dead_letter_at_the_last(kit: Kit) -> None:
    backend = kit.backend
    task = Task(cmd="exit 7", max_attempts=3)
    backend.push([task])
    (lease,) = receive_until(kit, backend)
    assert lease.attempt == 1
    lease.release(count_attempt=False)  # preempted: this attempt does not count
    attempts = []
    for _ in range(3):
        (lease,) = receive_until(kit, backend)
        attempts.append(lease.attempt)
        assert lease.task is not None and lease.task.id == task.id
        if lease.attempt < task.max_attempts:
            lease.release(count_attempt=True)  # a retry: counted
    assert attempts == [1, 2, 3]
    before = time.time()
    lease.dead_letter("exit status 7; attempt 3 of 3", "line 1\nline 2\n", exit_status=7)
    assert receive_now(kit, backend) == []
    (record,) = backend.failed()
    assert (record.id, record.attempts, record.reason, record.exit_status, record.output_tail,
            record.worker, record.command) == (
        task.id, 3, "exit status 7; attempt 3 of 3", 7, "line 1\nline 2\n", WORKER, task.cmd)
    assert Task.parse(record.body).id == task.id
    assert record.failed_at is not None and before - 5 <= record.failed_at <= time.time() + 5
    assert backend.status().counts["failed"] == 1


def test_a_retry_delay_holds_the_task_back_where_the_backend_applies_it(kit: Kit) -> None:
    backend, delay = kit.backend, 2.0
    backend.push([Task(cmd="x")])
    (lease,) = receive_until(kit, backend)
    released = time.time()
    lease.release(count_attempt=True, delay=delay)
    if backend.no_retry_delay is not None:  # Service Bus: an abandon cannot be delayed
        assert [t.not_before for t in backend.peek(5) if isinstance(t, Task)] == [None]
        (again,) = receive_until(kit, backend)
    else:
        if kit.traits.peek_shows_held:
            (held,) = backend.peek(5)
            assert isinstance(held, Task) and held.not_before is not None
            assert released + delay - 0.01 <= held.not_before <= time.time() + delay + 0.01
        stamps: list[float] = []
        (again,) = receive_until(kit, backend, stamps=stamps)
        assert stamps[0] >= released + delay - 0.05, stamps[0] - released
    assert again.attempt == 2
    again.complete()


def test_failed_requeue_and_clear(kit: Kit) -> None:
    backend = kit.backend
    a, b = Task(cmd="exit 3", id="task-a"), Task(cmd="exit 4", id="task-b")
    backend.push([a, b])
    for lease in receive_until(kit, backend, want=2):
        lease.dead_letter("failed", "")
    assert receive_now(kit, backend) == []
    assert sorted(r.id for r in backend.failed()) == ["task-a", "task-b"]
    assert len(backend.failed()) == 2  # listing takes nothing away
    assert backend.requeue([]) == 0
    assert backend.requeue(["task-a", "no-such-task"]) == 1
    assert [r.id for r in backend.failed()] == ["task-b"]
    (back,) = receive_until(kit, backend)
    assert back.task is not None and back.task.id == "task-a" and back.attempt == 1
    back.complete()
    assert backend.requeue(None) == 1
    assert backend.failed() == []
    (back,) = receive_until(kit, backend)
    assert back.task is not None and back.task.id == "task-b" and back.attempt == 1
    back.dead_letter("failed again", "")
    assert backend.clear(failed=True) == 1
    assert backend.failed() == []
    backend.push([Task(cmd="c"), Task(cmd="d")])
    eventually(lambda: backend.size() == 2, "size 2")
    assert backend.clear(failed=False) == 2
    eventually(lambda: backend.size() == 0, "size 0 after clear")
    assert receive_now(kit, backend) == []


def test_clear_and_a_leased_task(kit: Kit) -> None:
    backend = kit.backend
    held, waiting_task = Task(cmd="held"), Task(cmd="waiting")
    backend.push([held])
    (lease,) = receive_until(kit, backend)
    backend.push([waiting_task])
    if kit.traits.clear_takes_leased:  # Storage Queue: it deletes what it cannot tell apart
        assert backend.clear(failed=False) == 2
        with pytest.raises(LeaseLost):
            lease.complete()
    else:
        assert backend.clear(failed=False) == 1
        lease.complete()
    eventually(lambda: backend.size() == 0, "size 0")
    assert backend.failed() == []


def test_status_counts_waiting_held_and_failed(kit: Kit) -> None:
    backend = kit.backend
    tasks = [Task(cmd="a"), Task(cmd="b"), Task(cmd="c")]
    backend.push(tasks)
    (lease,) = receive_until(kit, backend)
    held = 1 if kit.traits.size_counts_leased else 0
    eventually(lambda: backend.size() == 2 + held, "size")
    status = backend.status()
    assert waiting(status) == 2 + held
    running = status.running
    if kit.traits.lists_running:
        assert [(r["id"], r["worker"], r["attempt"]) for r in running] == [
            (lease.task.id if lease.task else "", WORKER, 1)]
    else:
        assert running == []
    lease.dead_letter("failed", "")

    def settled() -> bool:
        status = backend.status()
        return status.counts["failed"] == 1 and waiting(status) == 2

    eventually(settled, "2 waiting, 1 failed")


# --------------------------------------------------------------------------- scheduling
def test_not_before_holds_a_pushed_task_back(kit: Kit) -> None:
    backend = kit.backend
    later = Task(cmd="later", not_before=round(time.time() + 2.0, 3))
    ready = Task(cmd="ready")
    backend.push([later, ready])
    peeked = {t.id: t for t in backend.peek(5) if isinstance(t, Task)}
    if kit.traits.peek_shows_held:
        assert set(peeked) == {later.id, ready.id}
        assert later.not_before is not None
        assert abs((peeked[later.id].not_before or 0) - later.not_before) < 0.01
        assert peeked[ready.id].not_before is None
    else:  # Storage Queue peeks only what is visible now
        assert set(peeked) <= {later.id, ready.id} and ready.id in peeked
    stamps: list[float] = []
    leases = receive_until(kit, backend, want=2, stamps=stamps)
    at = {le.task.id: stamp for le, stamp in zip(leases, stamps) if le.task}
    assert set(at) == {later.id, ready.id}
    assert at[later.id] >= later.not_before - 0.01, at[later.id] - later.not_before
    for lease in leases:
        lease.complete()


def test_the_longest_delay_or_its_refusal(backend: Backend) -> None:
    now = time.time()
    if backend.max_delay is not None:  # Storage Queue: a visibility timeout, 7 days at most
        assert backend.max_delay > 0
        [task] = push_schedule(push_options("--delay", f"{backend.max_delay:.0f}s"), backend,
                               [Task(cmd="true")], now)
        assert task.not_before == pytest.approx(now + backend.max_delay, abs=0.01)
        with pytest.raises(UsageError) as info:
            push_schedule(push_options("--delay", f"{backend.max_delay + 86400:.0f}s"),
                          backend, [Task(cmd="true")], now)
        assert "--delay" in str(info.value) and backend.name in str(info.value)
    else:
        [task] = push_schedule(push_options("--delay", "400d"), backend, [Task(cmd="true")],
                               now)
        assert task.not_before == pytest.approx(now + 400 * 86400, abs=0.01)


def test_priorities_or_the_refusal(kit: Kit) -> None:
    backend = kit.backend
    if not backend.priorities:
        with pytest.raises(UsageError) as info:
            push_schedule(push_options("--priority", "9"), backend, [Task(cmd="true")],
                          time.time())
        text = str(info.value)
        assert "--priority" in text and backend.name in text and "\n" not in text
        return
    [urgent] = push_schedule(push_options("--priority", "9"), backend, [Task(cmd="urgent")],
                             time.time())
    low, mid = Task(cmd="low", priority=1), Task(cmd="mid", priority=5)
    backend.push([low, urgent, mid])
    assert ids(backend.peek(5)) == [urgent.id, mid.id, low.id]
    order = []
    for _ in range(3):
        (lease,) = receive_until(kit, backend)
        order.append(lease.task.id if lease.task else "")
        lease.complete()
    assert order == [urgent.id, mid.id, low.id]


# --------------------------------------------------------------------------- several queues
def _two_queues(kit: Kit, order: str) -> tuple[MultiQueueBackend, dict[str, str]]:
    """A MultiQueueBackend over queues hi and lo with two tasks each, keyed by the service's
    queue names as a worker keys them; task id -> queue."""
    queues = {kit.queue_named(q): kit.make(queue=q) for q in ("hi", "lo")}
    where = {}
    for name, backend in queues.items():
        tasks = [Task(cmd=f"{name} {i}") for i in range(2)]
        backend.push(tasks)
        where.update({t.id: name for t in tasks})
    return MultiQueueBackend(queues, order), where


def test_several_queues_strict_order_each_lease_on_its_queue(kit: Kit) -> None:
    multi, where = _two_queues(kit, "strict")
    hi_name, lo_name = kit.queue_named("hi"), kit.queue_named("lo")
    hi, lo = multi.backends[hi_name], multi.backends[lo_name]
    assert multi.name == kit.backend.name and multi.size() == 4
    leases = [receive_until(kit, multi)[0] for _ in range(4)]  # one slot at a time
    queues = [le.queue for le in leases]
    assert queues == [hi_name, hi_name, lo_name, lo_name]
    assert all(where[le.task.id] == le.queue for le in leases if le.task)
    for lease in leases[:3]:
        lease.complete()
    leases[3].dead_letter("failed", "")  # into its own queue's failed place
    assert hi.failed() == [] and [r.id for r in lo.failed()] == [leases[3].task.id
                                                                  if leases[3].task else ""]
    eventually(lambda: multi.size() == 0, "every queue empty")
    multi.paused = frozenset({hi_name})
    hi.push([Task(cmd="paused")])
    assert receive_now(kit, multi) == []
    multi.paused = frozenset()
    (lease,) = receive_until(kit, multi)
    assert lease.queue == hi_name
    lease.complete()
    for one_queue in (lambda: multi.push([Task(cmd="x")]), lambda: multi.peek(1),
                      multi.status, multi.failed, lambda: multi.requeue(None),
                      lambda: multi.clear(False)):
        with pytest.raises(BackendConfigError, match="one queue"):
            one_queue()


def test_several_queues_round_robin_alternates(kit: Kit) -> None:
    multi, where = _two_queues(kit, "round-robin")
    leases = [receive_until(kit, multi)[0] for _ in range(4)]
    hi_name, lo_name = kit.queue_named("hi"), kit.queue_named("lo")
    assert [le.queue for le in leases] == [hi_name, lo_name, hi_name, lo_name]
    assert all(where[le.task.id] == le.queue for le in leases if le.task)
    for lease in leases:
        lease.complete()
    eventually(lambda: multi.size() == 0, "every queue empty")
