"""StorageQueueBackend against Azurite, with the fault proxy for network failures."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from contextlib import closing
from datetime import datetime, timedelta, timezone

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import ServiceRequestError
from azure.core.rest import HttpRequest
from azure.storage.queue import (
    AccountSasPermissions,
    QueueClient,
    ResourceTypes,
    TextBase64EncodePolicy,
    generate_account_sas,
)

from supervisor.backends.base import BackendConfigError, BackendError, LeaseLost
from supervisor.backends.storage_queue.backend import StorageQueueBackend
from supervisor.core.task import Task
from tests.azurite import ACCOUNT, ACCOUNT_KEY, queue_connection_string
from tests.conftest import wait_for
from tests.faults.proxy import FaultProxy

pytestmark = [pytest.mark.azure, pytest.mark.timeout(60)]


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def make_backend(azurite, queue_name, close_at_end):
    def make(port=None, **kw):
        kw.setdefault("worker_id", "w1")
        return close_at_end(StorageQueueBackend(
            queue_name, connection_string=queue_connection_string(port or azurite.port), **kw))

    return make


@pytest.fixture
def backend(make_backend):
    return make_backend()


@pytest.fixture
def raw(azurite, backend):
    """A plain SDK client on the same queue (what another producer would use)."""
    with closing(QueueClient.from_connection_string(azurite.connection_string,
                                                    backend.queue_name)) as client:
        yield client


@pytest.fixture
def proxy(azurite):
    with closing(FaultProxy(("127.0.0.1", azurite.port))) as p:
        yield p


def receive_one(backend, lock=30.0, timeout=5.0):
    return wait_for(lambda: backend.receive(1, lock), timeout)[0]


def test_push_receive_complete(backend):
    tasks = [Task(cmd="echo one", env={"A": "1"}), Task(cmd="echo two", cwd="/tmp")]
    assert backend.push(tasks) == [t.id for t in tasks]
    assert wait_for(lambda: backend.size() == 2, 5)
    assert [t.cmd for t in backend.peek(5)] == ["echo one", "echo two"]
    leases = backend.receive(10, 30)
    assert sorted(lease.task.cmd for lease in leases) == ["echo one", "echo two"]
    for lease in leases:
        assert lease.attempt == 1 and lease.format_error is None
        assert lease.lock_duration == 30.0
        assert json.loads(lease.raw_body)["version"] == 1
    assert leases[0].task.env == {"A": "1"} or leases[1].task.env == {"A": "1"}
    assert backend.receive(10, 30) == []  # both invisible now
    for lease in leases:
        lease.complete()
    assert wait_for(lambda: backend.size() == 0, 5)
    with pytest.raises(LeaseLost):
        leases[0].complete()  # settled leases are never settled again


def test_every_renewal_uses_the_newest_pop_receipt(backend):
    backend.push([Task(cmd="x")])
    lease = receive_one(backend)
    first = lease._pop_receipt
    for _ in range(3):
        assert lease.renew(timeout=5) == 30.0
    assert lease._pop_receipt != first
    lease._pop_receipt = first  # what a backend that kept the old receipt would send
    with pytest.raises(LeaseLost):
        lease.renew(timeout=5)
    with pytest.raises(LeaseLost):  # a lost lease is never settled
        lease.complete()


def test_release_for_preemption_keeps_the_attempt(backend):
    backend.push([Task(cmd="x", max_attempts=3)])
    lease = receive_one(backend)
    assert lease.attempt == 1
    lease.release(count_attempt=False)
    again = receive_one(backend, timeout=3)
    assert again.dequeue_count == 2 and again.task.preemptions == 1
    assert again.attempt == 1 and again.task.max_attempts == 3
    again.release(count_attempt=True)
    third = receive_one(backend, timeout=3)
    assert third.attempt == 2 and third.task.preemptions == 1
    third.complete()


def test_requeue_resets_preemptions(backend):
    backend.push([Task(cmd="x", id="p")])
    lease = receive_one(backend)
    lease.release(count_attempt=False)
    lease = receive_one(backend)
    assert lease.task.preemptions == 1
    lease.dead_letter("gave up", "")
    assert backend.requeue(None) == 1
    again = receive_one(backend)
    assert again.task.preemptions == 0 and again.attempt == 1


def test_failed_lists_more_than_the_peek_limit(backend):
    backend.push([Task(cmd=f"echo {i}", id=f"t{i}") for i in range(40)])
    remaining = 40
    while remaining:
        for lease in backend.receive(32, 60):
            lease.dead_letter("no", "")
            remaining -= 1
    assert len(backend.failed()) == 40
    assert len(backend.failed()) == 40  # made visible again
    assert backend.requeue(None) == 40
    assert backend.failed() == []
    assert wait_for(lambda: backend.size() == 40, 5)


def _send_raw_bytes(client: QueueClient, payload: bytes) -> None:
    # The SDK cannot send bytes that are not UTF-8, so send the XML request ourselves
    # through its pipeline (which signs it).  Azurite turns such bytes into U+FFFD.
    body = b"<QueueMessage><MessageText>" + payload + b"</MessageText></QueueMessage>"
    response = client._client.send_request(HttpRequest(
        "POST", client.url + "/messages", content=body,
        headers={"Content-Type": "application/xml"}))
    assert response.status_code == 201, response.text()


ENVELOPE_NO_CMD = json.dumps({"version": 1, "id": "n", "num_retries": 0,
                              "reply_requested": False, "kwargs": json.dumps({"env": {}})})
ENVELOPE_V99 = json.dumps({"version": 99, "id": "v", "num_retries": 0,
                           "reply_requested": False, "kwargs": json.dumps({"cmd": "true"})})


@pytest.mark.parametrize("body, expect", [
    ("not json at all", "not JSON"),
    (ENVELOPE_NO_CMD, "no command"),
    (ENVELOPE_V99, "version 99"),
    (b"\xff\xfe{\"cmd\": \x80", "not UTF-8"),
    ("", "not JSON"),
])
def test_poison_bodies_become_poison_leases(backend, raw, body, expect):
    if isinstance(body, bytes):
        _send_raw_bytes(raw, body)
    else:
        raw.send_message(body)
    backend.push([Task(cmd="good")])
    leases = wait_for(lambda: backend.receive(5, 30), 5)
    if len(leases) < 2:
        leases += wait_for(lambda: backend.receive(5, 30), 5)
    poison = [lease for lease in leases if lease.task is None]
    good = [lease for lease in leases if lease.task is not None]
    assert len(poison) == 1 and len(good) == 1
    lease = poison[0]
    assert expect in lease.format_error and lease.attempt == 1
    if isinstance(body, str):
        assert lease.raw_body == body
    else:
        assert "\ufffd" in lease.raw_body
    lease.dead_letter(lease.format_error, "")
    good[0].complete()
    [record] = backend.failed()
    assert record.id == lease.message_id and expect in record.reason
    assert record.body == lease.raw_body and record.command == ""
    assert backend.peek(5) == []


def test_base64_body_is_poison_with_a_hint(azurite, backend):
    b64 = QueueClient.from_connection_string(azurite.connection_string, backend.queue_name,
                                             message_encode_policy=TextBase64EncodePolicy())
    b64.send_message(Task(cmd="true").to_json())
    b64.close()
    lease = receive_one(backend)
    assert lease.task is None and "base64" in lease.format_error
    lease.dead_letter(lease.format_error, "")


def test_large_output_tail_is_trimmed_to_fit(backend):
    task = Task(cmd="echo " + "x" * 30000, env={"Q": '"' * 5000})
    backend.push([task])
    lease = receive_one(backend)
    tail = "".join(f"line {i} \x1b[31m\"quoted\"\n" for i in range(20000)) + "THE END\n"
    lease.dead_letter("r" * 10000, tail, exit_status=1)
    [record] = backend.failed()
    assert record.output_tail.endswith("THE END\n") and len(record.output_tail) < len(tail)
    assert Task.parse(record.body) == task  # the task itself is never cut
    assert backend.requeue(None) == 1


@pytest.mark.timing  # times the give-up
def test_renew_through_blackhole_gives_up_within_its_timeout(azurite, make_backend, proxy):
    backend = make_backend(port=proxy.port)
    backend.push([Task(cmd="x")])
    lease = receive_one(backend)
    assert lease.renew(timeout=2) == 30.0
    proxy.blackhole()
    for timeout in (2.0, 0.5):
        start = time.monotonic()
        with pytest.raises(BackendError) as info:
            lease.renew(timeout=timeout)
        elapsed = time.monotonic() - start
        assert not isinstance(info.value, LeaseLost)
        # It waited (the black hole was in effect), and gave up in time.
        assert timeout / 2 - 0.1 <= elapsed <= timeout + 2, elapsed
    # Drop the held requests (they never reach Azurite), then traffic flows again:
    # the pop receipt is still good, so renewing works.
    proxy.reset_all()
    proxy.restore()
    assert lease.renew(timeout=5) == 30.0
    lease.complete()


@pytest.mark.timing  # times the give-up
def test_main_thread_calls_give_up_under_blackhole(make_backend, proxy):
    backend = make_backend(port=proxy.port, read_timeout=1.5, connect_timeout=1.0)
    proxy.blackhole()
    for call in (lambda: backend.receive(1, 30), backend.size,
                 lambda: backend.push([Task(cmd="x")])):
        start = time.monotonic()
        with pytest.raises(BackendError):
            call()
        assert time.monotonic() - start <= 1.5 + 2
    proxy.reset_all()
    proxy.restore()
    assert backend.receive(1, 30) == []


def test_connection_reset_is_transient(make_backend, proxy):
    backend = make_backend(port=proxy.port)
    backend.push([Task(cmd="x")])
    lease = receive_one(backend)
    proxy.latency(0.5)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_catch(lambda: lease.renew(5))))
    thread.start()
    wait_for(lambda: proxy.connection_count >= 2, 3, 0.02)
    time.sleep(0.2)
    proxy.reset_all()
    thread.join(10)
    proxy.latency(0)
    assert isinstance(errors[0], BackendError) and not isinstance(errors[0], LeaseLost)


def _catch(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - returned to the test
        return exc
    return None


@pytest.mark.timing  # asserts a 3 s bound
def test_closed_port_fails_fast_with_backend_error(queue_name):
    start = time.monotonic()
    with pytest.raises(BackendError):
        StorageQueueBackend(queue_name, connection_string=queue_connection_string(free_port()))
    assert time.monotonic() - start < 3


def test_bad_account_key_is_a_config_error(azurite, queue_name):
    wrong = base64.b64encode(b"not the key" * 6).decode()
    for key in (wrong, "notbase64!"):
        cs = queue_connection_string(azurite.port, key=key)
        with pytest.raises(BackendConfigError) as info:
            StorageQueueBackend(queue_name, connection_string=cs)
        err = info.value
        for text in (str(err), repr(err)):
            assert key not in text and cs not in text
        assert err.__cause__ is None and err.__suppress_context__


def test_secrets_never_in_repr_or_errors(azurite, make_backend, proxy):
    backend = make_backend(port=proxy.port, read_timeout=1, connect_timeout=1)
    assert ACCOUNT_KEY not in repr(backend) and "127.0.0.1" in repr(backend)
    backend.push([Task(cmd="x")])
    lease = receive_one(backend)
    proxy.blackhole()
    errors = [_catch(lambda: backend.receive(1, 30)), _catch(lambda: lease.renew(1))]
    proxy.reset_all()
    proxy.restore()
    lease._pop_receipt = "stale"
    errors.append(_catch(lambda: lease.renew(2)))
    assert [type(e) for e in errors] == [BackendError, BackendError, LeaseLost]
    for err in errors:
        assert ACCOUNT_KEY not in str(err) and ACCOUNT_KEY not in repr(err)
    with pytest.raises(BackendConfigError) as info:
        StorageQueueBackend("q-x", connection_string="AccountKey=" + ACCOUNT_KEY + ";garbage")
    assert ACCOUNT_KEY not in str(info.value)


def test_configuration_errors(azurite):
    cs = azurite.connection_string
    with pytest.raises(BackendConfigError):
        StorageQueueBackend("jobs", connection_string=cs, account_url="http://127.0.0.1:1/x")
    with pytest.raises(BackendConfigError):
        StorageQueueBackend("jobs")
    for bad in ("Jobs", "a", "a--b", "-ab", "x" * 60, "has_underscore"):
        with pytest.raises(BackendConfigError):
            StorageQueueBackend(bad, connection_string=cs)


def test_account_url_with_explicit_credential(azurite, queue_name):
    backend = StorageQueueBackend(
        queue_name, account_url=f"http://127.0.0.1:{azurite.port}/{ACCOUNT}",
        credential=AzureNamedKeyCredential(ACCOUNT, ACCOUNT_KEY))
    try:
        backend.push([Task(cmd="x")])
        receive_one(backend).complete()
    finally:
        backend.close()


def test_leases_renew_concurrently_from_their_own_threads(backend):
    backend.push([Task(cmd=f"t{i}") for i in range(4)])
    leases = wait_for(lambda: backend.receive(4, 30), 5)
    while len(leases) < 4:
        leases += backend.receive(4, 30)
    errors = []

    def keeper(lease):
        try:
            for _ in range(5):
                lease.renew(timeout=5)
            lease.complete()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=keeper, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for _ in range(5):
        assert backend.receive(4, 30) == []  # the main thread keeps polling meanwhile
    for t in threads:
        t.join(10)
    assert errors == []
    assert wait_for(lambda: backend.size() == 0, 5)


def test_dead_letter_retry_after_failed_delete_sends_one_record(backend):
    backend.push([Task(cmd="x", id="once")])
    lease = receive_one(backend)
    flaky = backend.new_client(backend.queue_name)
    real_delete, failures = flaky.delete_message, []

    def flaky_delete(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise ServiceRequestError("connection reset (injected)")
        return real_delete(*args, **kwargs)

    flaky.delete_message = flaky_delete
    backend._idle_clients.append(flaky)  # the lease's next call takes it
    with pytest.raises(BackendError) as info:
        lease.dead_letter("boom", "")
    assert not isinstance(info.value, LeaseLost)
    lease.dead_letter("boom", "")  # the worker retries
    assert [r.id for r in backend.failed()] == ["once"]
    assert backend.receive(1, 30) == []


def test_failed_shows_and_requeues_bare_ai4s_envelopes(azurite, backend):
    # An ai4s-jobq worker on the same queue dead-letters the bare envelope.
    envelope = json.loads(Task(cmd="echo hi", id="ai4s-1").to_json())
    envelope["error"] = "Command 'echo hi' failed with return code 1"
    failed_queue = QueueClient.from_connection_string(azurite.connection_string,
                                                      backend.failed_queue_name)
    failed_queue.send_message(json.dumps(envelope))
    failed_queue.close()
    [record] = backend.failed()
    assert record.id == "ai4s-1" and record.command == "echo hi"
    assert record.reason.startswith("Command 'echo hi' failed")
    assert backend.requeue(["ai4s-1"]) == 1
    lease = receive_one(backend)
    assert lease.task.id == "ai4s-1" and lease.attempt == 1


def test_sas_without_create_permission_works_on_an_existing_queue(azurite, backend, caplog):
    sas = generate_account_sas(
        ACCOUNT, ACCOUNT_KEY, resource_types=ResourceTypes(container=True, object=True),
        permission=AccountSasPermissions(read=True, add=True, update=True, process=True,
                                         delete=True),
        expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    cs = (f"SharedAccessSignature={sas};"
          f"QueueEndpoint=http://127.0.0.1:{azurite.port}/{ACCOUNT}")
    limited = StorageQueueBackend(backend.queue_name, connection_string=cs, worker_id="sas")
    try:
        assert "not allowed to create queue" in caplog.text
        assert sas not in repr(limited)
        limited.push([Task(cmd="x")])
        lease = receive_one(limited)
        assert lease.renew(5) == 30.0
        lease.dead_letter("no", "")
        assert limited.size() == 0
    finally:
        limited.close()
    assert [r.worker for r in backend.failed()] == ["sas"]


def _delete_without_answer(make_backend, proxy, raw):
    """A lease whose delete reached Azurite and was applied, but whose answer came after the
    read timeout (a BackendError, not LeaseLost): the lease, for what the test does next."""
    backend = make_backend(port=proxy.port, read_timeout=1.0, connect_timeout=1.0)
    backend.push([Task(cmd="x")])
    lease = receive_one(backend)
    proxy.latency(0.8)  # each way: the request lands at 0.8 s, the answer at 1.6 s
    with pytest.raises(BackendError) as info:
        lease.complete()
    assert not isinstance(info.value, LeaseLost)
    proxy.latency(0)
    wait_for(lambda: raw.get_queue_properties().approximate_message_count == 0, 10,
             what="the first delete applied")
    return lease


def test_a_delete_retried_after_a_lost_answer_is_done_not_a_lost_lease(make_backend, proxy,
                                                                       raw):
    # The first delete reaches Azurite but its answer comes after the read timeout; the
    # retry finds the message gone: that is our delete, applied, not a lost lease.
    lease = _delete_without_answer(make_backend, proxy, raw)
    lease.complete()  # no LeaseLost


def test_a_renewal_refused_after_a_delete_without_answer_leaves_the_retry_to_tell(
        make_backend, proxy, raw):
    # Issue 26: the keeper renews while a settlement waits.  After a delete that got no answer
    # but was applied, the renewal finds the message gone -- that refusal must not end the
    # lease, or the retry could not see that the delete was ours.
    lease = _delete_without_answer(make_backend, proxy, raw)
    with pytest.raises(LeaseLost):
        lease.renew(5)
    lease.complete()  # done, not "lease already settled or lost"


def test_a_message_deleted_by_someone_else_is_a_lost_lease(backend, raw):
    backend.push([Task(cmd="x")])
    lease = receive_one(backend)
    raw.delete_message(lease.message_id, lease._pop_receipt)  # not by this lease's call
    with pytest.raises(LeaseLost):
        lease.complete()


def test_a_release_retried_after_a_lost_answer_is_done_not_a_lost_lease(make_backend, proxy,
                                                                        raw):
    # The same for a release (a held message given back): applied, its pop receipt changed,
    # so the retry is refused -- yet the message is back in the queue, as the release wanted.
    backend = make_backend(port=proxy.port, read_timeout=1.0, connect_timeout=1.0)
    backend.push([Task(cmd="x")])
    lease = receive_one(backend)
    proxy.latency(0.8)
    with pytest.raises(BackendError) as info:
        lease.release(count_attempt=False)
    assert not isinstance(info.value, LeaseLost)
    proxy.latency(0)
    wait_for(lambda: raw.peek_messages(max_messages=1), 10, what="the first release applied")
    lease.release(count_attempt=False)  # no LeaseLost
    again = receive_one(backend)
    assert again.message_id == lease.message_id and again.attempt == 1
