"""Several messages per receive call on Service Bus, their leases sharing one receiver
(servicebus_pool.SharedReceiver): in this process with the real SDK, and through the real
supervisor against the AMQP test broker."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from supervisor.backends.base import BackendError, LeaseLost
from supervisor.core.task import Task
from tests.conftest import wait_for
from tests.integration.helpers import ready_count, write_recorder

from .conftest import work_backend

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(90)]


@pytest.fixture
def backend(sb_broker):
    b = work_backend(sb_broker, receivers=4)
    yield b
    b.close()


def _receive(backend, n: int) -> list:
    """``backend.receive`` until it gives ``n`` leases (a receive returns what arrived within
    the SDK's short wait after the first message)."""
    leases: list = []
    deadline = time.monotonic() + 20
    while len(leases) < n and time.monotonic() < deadline:
        try:
            leases += backend.receive(n - len(leases), 5)
        except BackendError as exc:  # no receiver open yet
            assert "no connection to Service Bus ready" in str(exc)
    assert len(leases) == n
    return leases


def _on_threads(leases, fn) -> list[BaseException]:
    """``fn(lease)`` for every lease at once, one thread each (as their keepers would)."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(leases))

    def run(lease) -> None:
        start.wait()
        try:
            fn(lease)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


def test_one_call_takes_several_messages_and_their_keepers_share_the_receiver(
        backend, sb_broker):
    backend.push([Task(cmd="true", id=f"t{i}") for i in range(6)])
    leases = backend.receive(4, 5)
    assert len(leases) == 4, "one call, four messages"
    assert len({id(lease._shared) for lease in leases}) == 1
    # Renewals and settlements from four threads at once: one SDK call at a time on the
    # receiver, none lost, none failed.
    assert _on_threads(leases, lambda lease: lease.renew(3)) == []
    assert _on_threads(leases, lambda lease: lease.complete()) == []
    assert len(sb_broker.events("renew")) == 4
    assert len(sb_broker.events("complete")) == 4
    assert sb_broker.events("settle_lock_lost") == [] and sb_broker.events("lock_expired") == []
    rest = _receive(backend, 2)
    assert sorted(lease.task.id for lease in rest) == ["t4", "t5"]
    for lease in rest:
        lease.complete()
    assert sb_broker.active_count("work") == 0


def test_a_lost_lease_of_a_batch_leaves_the_others_alone(backend, sb_broker):
    backend.push([Task(cmd="true", id=f"t{i}") for i in range(3)])
    leases = backend.receive(3, 5)
    assert len(leases) == 3
    shared = leases[0]._shared
    lost, *others = leases
    token = next(m.lock_token for m in sb_broker.messages("work")
                 if json.loads(m.body)["id"] == lost.task.id)
    sb_broker.fail_renewals(True, lock_token=token)
    with pytest.raises(LeaseLost):
        lost.renew(3)
    assert shared.retired, "a lost lease retires its receiver: no receive uses it again"
    # ... but it stays open for the others, which renew and settle on it as before.
    assert _on_threads(others, lambda lease: lease.renew(3)) == []
    others[0].complete()
    assert not shared._closed
    others[1].release(count_attempt=True)
    wait_for(lambda: shared._closed, 10, what="the retired receiver closed after its last lease")
    kinds = [e.kind for e in sb_broker.events() if e.kind != "peek"]
    assert kinds.count("complete") == 1 and kinds.count("abandon") == 1
    sb_broker.fail_renewals(False)
    sb_broker.expire_locks("work")  # the lost one comes back: attempt 2, on another receiver
    (again,) = _receive(backend, 1)
    assert (again.task.id, again.attempt) == (lost.task.id, 2)
    assert again._shared is not shared
    again.complete()


@pytest.mark.timing  # asserts a 1 s bound
def test_a_keeper_waits_for_the_receiver_only_within_its_timeout(backend, sb_broker):
    """A call of one lease holds the receiver; another lease's call waits for it no longer
    than its own timeout and then fails as transient (its keeper retries)."""
    backend.push([Task(cmd="true"), Task(cmd="true")])
    first, second = backend.receive(2, 5)
    with first._shared.lock:  # as if a call of ``first`` hung
        started = time.monotonic()
        with pytest.raises(BackendError) as info:
            second.renew(0.3)
        assert not isinstance(info.value, LeaseLost) and "busy" in str(info.value)
        assert time.monotonic() - started < 1.0
    second.renew(3)
    first.complete()
    second.complete()


# -- through the supervisor ------------------------------------------------------------------

def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _kinds(broker) -> list[str]:
    return [e.kind for e in broker.events() if e.kind != "peek"]


def test_a_batch_received_in_one_call_runs_and_completes(sb_env):
    out = sb_env.tmp / "out"
    ids = sb_env.push(*[f"sleep 0.5; echo $JOBQ_TASK_ID >> {out}" for _ in range(8)])
    sup = sb_env.supervisor("-n", "8", "--exit-when-empty", "--log-level", "debug")
    assert sup.wait(60) == 0, sup.log()
    assert sorted(_lines(out)) == sorted(ids)
    assert "received 8 message(s) in one call (asked for 8)" in sup.log()
    kinds = _kinds(sb_env.broker)
    assert kinds.count("deliver") == 8 and kinds.count("complete") == 8
    assert sb_env.broker.active_count("work") == 0
    assert "succeeded=8" in sup.log()


def test_renewals_of_a_batch_keep_every_lock(sb_env):
    broker = sb_env.broker
    broker.create_queue("work", lock_duration=3)
    out = sb_env.tmp / "out"
    ids = sb_env.push(*[f"sleep 7; echo $JOBQ_TASK_ID >> {out}" for _ in range(4)])
    sup = sb_env.supervisor("-n", "4", "--lock-duration", "3", "--exit-when-empty",
                            "--log-level", "debug")
    assert sup.wait(60) == 0, sup.log()
    assert sorted(_lines(out)) == sorted(ids)
    assert "received 4 message(s) in one call" in sup.log()
    renewed = {e.lock_token for e in broker.events("renew")}
    assert len(renewed) == 4, "every lease of the batch was renewed"
    assert len(broker.events("renew")) >= 4 * 3
    assert broker.events("lock_expired") == [] and broker.events("renew_failed") == []
    kinds = _kinds(broker)
    assert kinds.count("deliver") == 4 and kinds.count("complete") == 4


def test_lock_loss_of_one_batch_lease_kills_only_its_task(sb_env):
    broker = sb_env.broker
    broker.create_queue("work", lock_duration=3)
    out = sb_env.tmp / "out"
    ids = sb_env.push(*[f'echo "$JOBQ_TASK_ID $JOBQ_ATTEMPT" >> {out}; sleep 6; '
                        f'echo "$JOBQ_TASK_ID done" >> {out}' for _ in range(3)])
    sup = sb_env.supervisor("-n", "3", "--lock-duration", "3", "--exit-when-empty",
                            "--log-level", "debug")
    wait_for(lambda: len(_lines(out)) == 6, 30, what="three tasks started")
    sup.wait_log("received 3 message(s) in one call")  # the log writer may lag under load
    wait_for(lambda: len({e.lock_token for e in broker.events("renew")}) == 3, 10,
             what="a renewal of each lease")
    victim = broker.messages("work")[0]
    victim_id = json.loads(victim.body)["id"]
    broker.fail_renewals(True, lock_token=victim.lock_token)
    wait_for(lambda: broker.events("renew_failed"), 10, what="the refused renewal")
    assert sup.wait(60) == 0, sup.log()
    broker.fail_renewals(False)
    runs = out.read_text().split("\n")
    survivors = [i for i in ids if i != victim_id]
    for task_id in survivors:  # ran once, to the end, completed
        assert runs.count(f"{task_id} 1") == 1 and runs.count(f"{task_id} done") == 1
    # The victim was killed before its end, and ran again from the broker.
    assert runs.count(f"{victim_id} 1") == 1 and runs.count(f"{victim_id} 2") == 1
    assert runs.count(f"{victim_id} done") == 1
    kinds = _kinds(broker)
    assert kinds.count("complete") == 3 and kinds.count("renew_failed") >= 1
    assert "lock_lost=1" in sup.log() and "succeeded=3" in sup.log()
    assert broker.active_count("work") == 0


def test_sigterm_settles_every_lease_of_a_shared_receiver(sb_env):
    broker = sb_env.broker
    rec = write_recorder(sb_env.tmp)
    marks = sb_env.tmp / "t"
    ids = sb_env.push(*[f"{rec} {marks} 0.5" for _ in range(4)])
    sup = sb_env.supervisor("-n", "4", "--lock-duration", "6", "--log-level", "debug")
    wait_for(lambda: ready_count(marks) == 4, 30, what="four tasks ready")
    sup.wait_log("received 4 message(s) in one call")  # the log writer may lag under load
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()
    assert "requeued=4" in sup.log()
    # Every original was completed after its copy went out; the copies wait, unlocked.
    assert _kinds(broker).count("complete") == 4
    back = broker.messages("work")
    assert sorted(json.loads(m.body)["id"] for m in back) == sorted(ids)
    assert all(not m.locked and m.delivery_count == 0 for m in back)
    assert broker.events("settle_lock_lost") == [] and broker.events("lock_expired") == []


def test_a_receive_does_not_wait_behind_busy_receivers(backend, sb_broker):
    """When keepers' calls hold every open receiver (a broker slow to settle), the pool opens
    another rather than holding up the receive, and keeps it."""
    backend.push([Task(cmd="true", id="t1")])
    pool = backend.pool
    wait_for(lambda: len(pool._ready) >= 2, 20, what="the receivers kept open")
    busy = list(pool._ready)
    for shared in busy:
        shared.lock.acquire()
    try:
        want = pool._want
        (lease,) = _receive(backend, 1)
        assert lease._shared not in busy
        assert pool._want > want
        lease.complete()
    finally:
        for shared in busy:
            shared.lock.release()
