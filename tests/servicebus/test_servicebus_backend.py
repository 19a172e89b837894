"""ServiceBusBackend and its lease in this process, with the real SDK against the broker;
error mapping and secret scrubbing; the exactly-one-credential rule through the CLI."""

from __future__ import annotations

import logging
import os
import subprocess
import time

import pytest
from azure.servicebus import exceptions as sbx

from supervisor.backends.azure_common import Scrubber
from supervisor.backends.base import BackendConfigError, BackendError, LeaseLost, QueueNotFound
from supervisor.backends.servicebus.backend import ServiceBusBackend
from supervisor.backends.servicebus.errors import LockCheck, translate
from supervisor.core.task import Task
from tests.conftest import command

from .conftest import SECRET_KEY, close_backend, connection_string, work_backend

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(60)]


@pytest.fixture
def backend(sb_broker):
    b = work_backend(sb_broker, receivers=1)
    yield b
    close_backend(b)


@pytest.mark.parametrize("exc, lease, expected", [
    (sbx.MessageLockLostError(message="lock lost"), True, LeaseLost),
    (sbx.MessageAlreadySettled(action="complete"), True, LeaseLost),
    (sbx.MessageNotFoundError(message="gone"), True, LeaseLost),
    (sbx.MessageLockLostError(message="lock lost"), False, BackendError),
    (sbx.ServiceBusConnectionError(message="reset"), True, BackendError),
    (sbx.OperationTimeoutError(message="slow"), True, BackendError),
    (sbx.ServiceBusServerBusyError(message="busy"), True, BackendError),
    (sbx.ServiceBusError("something"), True, BackendError),
    (TimeoutError(), False, BackendError),
    (sbx.ServiceBusAuthenticationError(message="bad key"), False, BackendConfigError),
    (sbx.ServiceBusAuthorizationError(message="no Listen claim"), True, BackendConfigError),
    (sbx.MessagingEntityNotFoundError(message="no queue"), False, QueueNotFound),
])
def test_error_mapping(exc, lease, expected):
    error = translate(exc, "op", Scrubber(None, None), lease=lease)
    assert type(error) is expected
    assert str(error).startswith("op: ")


def test_errors_are_scrubbed():
    scrub = Scrubber(connection_string(1), None)
    exc = sbx.ServiceBusConnectionError(
        message=f"failed with {connection_string(1)} and {SECRET_KEY}")
    error = translate(exc, "receive", scrub)
    assert SECRET_KEY not in str(error) and SECRET_KEY not in repr(error)


def test_lock_check_prefers_the_configured_lock_and_the_shorter_plausible_one(caplog):
    check = LockCheck(60.0)
    assert check.granted(60.4) == 60.0
    assert check.granted(58.5) == 60.0  # within 2 s: latency, small skew
    with caplog.at_level(logging.WARNING):
        assert check.granted(30.0) == 30.0  # queue lock shorter than --lock-duration
        assert check.granted(-500.0) == 60.0  # a skewed clock: not plausible
    assert len(caplog.records) == 1  # warned once


def test_bad_connection_string_and_dead_endpoint_leak_no_key(sb_broker):
    with pytest.raises(BackendConfigError) as info:
        ServiceBusBackend("work", connection_string=f"nonsense;SharedAccessKey={SECRET_KEY}")
    assert SECRET_KEY not in str(info.value)
    port = sb_broker.port
    sb_broker.stop()  # nothing listens there any more
    b = ServiceBusBackend("work", connection_string=connection_string(port))
    try:
        assert SECRET_KEY not in repr(b)
        with pytest.raises(BackendError) as info2:
            b.size()
        assert SECRET_KEY not in str(info2.value)
    finally:
        b.close()


def test_receive_renew_complete(backend, sb_broker):
    backend.push([Task(cmd="true", id="t1")])
    sb_broker.send("work", b"poison")
    assert [t.id if isinstance(t, Task) else t for t in backend.peek(5)] == ["t1", "poison"]
    assert backend.size() == 2
    (lease,) = backend.receive(1, 5)
    assert (lease.task.id, lease.attempt, lease.message_id, lease.lock_duration) == (
        "t1", 1, "t1", 5)
    assert lease.renew(3) == 5
    assert len(sb_broker.events("renew")) == 1
    lease.complete()
    with pytest.raises(LeaseLost):
        lease.complete()
    (poison,) = backend.receive(4, 5)
    assert poison.task is None and "not JSON" in poison.format_error
    poison.dead_letter("bad message", poison.raw_body)
    assert sb_broker.active_count("work") == 0 and backend.clear(failed=True) == 1


def test_receive_waits_briefly_while_a_lease_is_not_over(backend, monkeypatch):
    # The main thread blocks for a receive's whole wait on an empty queue; while a task of
    # this worker runs or settles, a short wait keeps that from holding it up.
    from azure.servicebus import ServiceBusReceiver

    from supervisor.backends.servicebus.backend import SHORT_RECEIVE_WAIT

    waits: list[float] = []
    real = ServiceBusReceiver.receive_messages

    def receive_messages(self, *args, **kwargs):
        waits.append(kwargs["max_wait_time"])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ServiceBusReceiver, "receive_messages", receive_messages)
    backend.receive_wait = 3.0
    backend.push([Task(cmd="true")])
    (lease,) = receive_when_ready(backend, 1, 5)
    assert not any(shared.credit_left for shared in backend.pool._ready)  # got what it asked
    assert backend.receive(1, 5) == []  # the queue is empty; the lease is not over
    # its credit is still out: the exit waits for this receiver's close (its release)
    assert any(shared.credit_left for shared in backend.pool._ready)
    lease.complete()
    assert backend.receive(1, 5) == []  # nothing in flight: the full wait
    assert waits[-2:] == [SHORT_RECEIVE_WAIT, 3.0]
    assert waits[0] == 3.0  # the first receive: nothing was in flight


@pytest.mark.parametrize("exit_when_empty, poll, wait", [
    (False, 1.0, 1.0), (False, 0.5, 0.5), (True, 1.0, 0.2), (True, 0.1, 0.1)])
def test_a_batch_run_receives_with_the_short_wait(sb_broker, exit_when_empty, poll, wait):
    # --exit-when-empty ends at the first empty receive: a long poll there is a second more
    # at the end of every batch run.
    from supervisor.backends import open_backend
    from supervisor.backends.servicebus.backend import SHORT_RECEIVE_WAIT
    from supervisor.core.settings import Settings

    sb_broker.create_queue("work", lock_duration=5)
    backend = open_backend(Settings(backend="servicebus", queue="work", worker_id="w1",
                                    connection_string=connection_string(sb_broker.port),
                                    lock_duration=5.0, exit_when_empty=exit_when_empty,
                                    poll_interval=poll))
    try:
        assert backend.receive_wait == wait
        assert SHORT_RECEIVE_WAIT == 0.2
    finally:
        backend.close()


def test_lock_shorter_than_configured_is_seen(sb_broker, caplog):
    sb_broker.create_queue("work", lock_duration=5)
    b = ServiceBusBackend("work", connection_string=connection_string(sb_broker.port),
                          lock_duration=60, receivers=1, receive_wait=0.5)
    try:
        b.push([Task(cmd="true")])
        with caplog.at_level(logging.WARNING):
            (lease,) = b.receive(1, 60)
        assert 3 < lease.lock_duration <= 5
        assert "using the shorter" in caplog.text
        assert 3 < lease.renew(3) <= 5.5
        lease.release(count_attempt=True)
    finally:
        b.close()
    assert sb_broker.delivery_counts("work") == [1]


def receive_when_ready(backend, n: int, lock: float, timeout: float = 20.0):
    """``backend.receive``, retried while no receiver link is open yet, as the worker's next
    turn would: a lease lost or settled may take its receiver with it, and opening another
    takes the SDK about half a second, more on a busy machine."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return backend.receive(n, lock)
        except BackendError as exc:
            if "no connection to Service Bus ready" not in str(exc) or \
                    time.monotonic() > deadline:
                raise


@pytest.mark.timing  # asserts second bounds
def test_calls_are_bounded_when_the_broker_hangs(backend, sb_broker):
    backend.push([Task(cmd="true")])
    (lease,) = backend.receive(1, 5)
    sb_broker.freeze()
    try:
        started = time.monotonic()
        with pytest.raises(BackendError) as info:
            lease.renew(1.0)
        assert not isinstance(info.value, LeaseLost)
        assert time.monotonic() - started < 2.0
        started = time.monotonic()
        with pytest.raises(BackendError):
            lease.complete()  # bounded by the time left on the lock
        assert time.monotonic() - started < 4.0
        started = time.monotonic()
        try:
            assert backend.receive(1, 5) == []
        except BackendError:
            pass  # no spare receiver open yet: fine, as long as it does not hang
        assert time.monotonic() - started < 3.0
    finally:
        sb_broker.unfreeze()


def test_preemption_resends_with_the_attempt_given_back(backend, sb_broker):
    backend.push([Task(cmd="true", id="t1")])
    (lease,) = backend.receive(1, 5)
    lease.release(count_attempt=False)
    (info,) = sb_broker.messages("work")
    assert info.message_id.startswith("p-") and info.application_properties == {
        "jobq_prior_attempts": 0}
    (again,) = receive_when_ready(backend, 1, 5)
    assert (again.task.id, again.task.preemptions, again.attempt) == ("t1", 1, 1)
    again.release(count_attempt=True)
    (third,) = receive_when_ready(backend, 1, 5)
    assert third.attempt == 2
    third.release(count_attempt=False)
    (fourth,) = receive_when_ready(backend, 1, 5)
    assert (fourth.attempt, fourth.task.preemptions) == (2, 2)
    fourth.complete()


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}


@pytest.mark.parametrize("prog, args", [
    ("jobq-ctl", ["size"]),
    ("jobq-supervisor", []),
    ("jobq-ctl", ["--connection-string", "x", "--namespace", "n.servicebus.windows.net",
                  "size"]),
])
def test_exactly_one_credential(prog, args):
    res = subprocess.run(command(prog) + ["--backend", "servicebus", *args], capture_output=True,
                         text=True, timeout=60, env=_clean_env())
    assert res.returncode == 2, res.stderr
    assert "exactly one of" in res.stderr and "Traceback" not in res.stderr


def test_bad_namespace_exits_2():
    res = subprocess.run(command("jobq-ctl") + ["--backend", "servicebus", "--namespace",
                                                "not a namespace!", "size"],
                         capture_output=True, text=True, timeout=60, env=_clean_env())
    assert res.returncode == 2 and "--namespace" in res.stderr


def test_size_without_administration_api_counts_by_peeking_and_says_so_once(
        backend, sb_broker, caplog, monkeypatch):
    """The queue sampler counts every 15 s: without Manage rights the administration API is
    tried once per ADMIN_RETRY, not on every count, and the fallback is logged once."""
    backend.push([Task(cmd="true"), Task(cmd="true")])
    backend.emulator = False  # as on a real namespace: size() tries the administration API
    tries = []

    def no_manage_rights():
        tries.append(1)
        raise sbx.ServiceBusAuthorizationError(message="Manage claim required")

    monkeypatch.setattr(backend, "_admin", no_manage_rights)
    with caplog.at_level(logging.INFO, logger="supervisor.backends.servicebus"):
        assert [backend.size() for _ in range(3)] == [2, 2, 2]
    assert len(tries) == 1
    assert sum("counting by peeking" in r.getMessage() for r in caplog.records) == 1
