"""Tests of the in-process Service Bus test broker, driven by the real azure-servicebus SDK.

Everything runs on the test thread except the broker (its own thread) and the SDK's own
keep-alive threads, which the SDK stops when its clients are closed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessageLockLostError, ServiceBusError

from .broker import DEAD_LETTER, ServiceBusTestBroker

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(60)]


@contextmanager
def sb_client(broker: ServiceBusTestBroker, **kwargs) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(broker.connection_string, **kwargs) as client:
        yield client


def peek_lock_receiver(client: ServiceBusClient, queue: str, **kwargs):
    return client.get_queue_receiver(
        queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0, **kwargs
    )


@contextmanager
def work_receiver(broker: ServiceBusTestBroker) -> Iterator[ServiceBusReceiver]:
    """A peek-lock receiver on the queue "work", on a client of its own."""
    with sb_client(broker) as client, peek_lock_receiver(client, "work") as receiver:
        yield receiver


def receive_one(receiver, max_wait_time: float = 5.0):
    messages = receiver.receive_messages(max_message_count=1, max_wait_time=max_wait_time)
    assert len(messages) == 1, f"expected one message, got {messages!r}"
    return messages[0]


def test_send_receive_complete(sb_broker: ServiceBusTestBroker) -> None:
    with sb_client(sb_broker) as client:
        with client.get_queue_sender("work") as sender:
            sender.send_messages(
                ServiceBusMessage("hello", message_id="m-1", application_properties={"k": "v"})
            )
        assert sb_broker.active_count("work") == 1
        with peek_lock_receiver(client, "work") as receiver:
            msg = receive_one(receiver)
            assert str(msg) == "hello"
            assert msg.message_id == "m-1"
            assert msg.application_properties == {b"k": b"v"}
            assert msg.delivery_count == 0
            assert msg.sequence_number == 1
            assert msg.enqueued_time_utc is not None
            info = sb_broker.messages("work")[0]
            assert info.locked and info.lock_token == msg.lock_token
            assert abs(msg.locked_until_utc.timestamp() - info.locked_until) < 0.01
            receiver.complete_message(msg)
    assert sb_broker.active_count("work") == 0
    assert [e.kind for e in sb_broker.events()] == ["enqueue", "deliver", "complete"]


def test_lock_expiry_redelivers_and_old_lock_is_lost(sb_broker: ServiceBusTestBroker) -> None:
    sb_broker.create_queue("work", lock_duration=2)
    sb_broker.send("work", b"job")
    with sb_client(sb_broker) as client:
        with peek_lock_receiver(client, "work") as first:
            stale = receive_one(first)
            assert stale.delivery_count == 0
            sb_broker.wait_for(lambda: sb_broker.available_count("work") == 1, timeout=5,
                               message="lock expiry")
            assert sb_broker.events("lock_expired")[0].lock_token == stale.lock_token
            with peek_lock_receiver(client, "work") as second:
                fresh = receive_one(second)
                assert fresh.sequence_number == stale.sequence_number
                assert fresh.delivery_count == 1
                assert fresh.lock_token != stale.lock_token
                with pytest.raises(MessageLockLostError):
                    first.complete_message(stale)
                second.complete_message(fresh)
    assert sb_broker.active_count("work") == 0


def test_settling_a_lock_the_broker_dropped_raises_lock_lost(
    sb_broker: ServiceBusTestBroker,
) -> None:
    """The client still believes the lock is valid; the broker answers message-lock-lost."""
    sb_broker.send("work", b"job")
    with work_receiver(sb_broker) as receiver:
        msg = receive_one(receiver)
        assert sb_broker.expire_locks("work") == 1
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(msg)
    assert [e.kind for e in sb_broker.events()][-1] == "settle_lock_lost"
    assert sb_broker.delivery_counts("work") == [1]


def test_renew_lock(sb_broker: ServiceBusTestBroker) -> None:
    sb_broker.create_queue("work", lock_duration=2)
    sb_broker.send("work", b"long job")
    with sb_client(sb_broker) as client:
        with peek_lock_receiver(client, "work") as holder:
            msg = receive_one(holder)
            original_until = msg.locked_until_utc
            started = time.monotonic()
            with peek_lock_receiver(client, "work") as other:
                previous = original_until
                while time.monotonic() - started < 4.5:  # more than twice the lock duration
                    renewed = holder.renew_message_lock(msg)
                    assert renewed > previous
                    previous = renewed
                    assert other.receive_messages(max_message_count=1, max_wait_time=0.6) == []
            assert previous.timestamp() - original_until.timestamp() > 2
            assert len(sb_broker.events("deliver")) == 1
            assert len(sb_broker.events("renew")) >= 4
            assert sb_broker.events("lock_expired") == []

            sb_broker.wait_for(lambda: bool(sb_broker.events("lock_expired")), timeout=5,
                               message="lock expiry")
            with pytest.raises(MessageLockLostError):
                holder.renew_message_lock(msg)


def test_fail_renewals_hook(sb_broker: ServiceBusTestBroker) -> None:
    sb_broker.send("work", b"a")
    sb_broker.send("work", b"b")
    with work_receiver(sb_broker) as receiver:
        first, second = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        sb_broker.fail_renewals(True)
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock(first)
        sb_broker.fail_renewals(False)
        receiver.renew_message_lock(first)

        sb_broker.fail_renewals(True, lock_token=second.lock_token)
        receiver.renew_message_lock(first)
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock(second)
        assert [e.detail["injected"] for e in sb_broker.events("renew_failed")] == [True, True]
        # the injected failure does not drop the lock
        receiver.complete_message(second)
        receiver.complete_message(first)
    assert sb_broker.active_count("work") == 0


def test_abandon_redelivers_with_incremented_delivery_count(
    sb_broker: ServiceBusTestBroker,
) -> None:
    sb_broker.send("work", b"flaky")
    with work_receiver(sb_broker) as receiver:
        for expected in range(3):
            msg = receive_one(receiver)
            assert msg.delivery_count == expected
            receiver.abandon_message(msg)
        assert sb_broker.delivery_counts("work") == [3]
        receiver.complete_message(receive_one(receiver))
    assert [e.kind for e in sb_broker.events()].count("abandon") == 3


def test_dead_letter_and_requeue(sb_broker: ServiceBusTestBroker) -> None:
    sb_broker.send("work", b"poison", message_id="p-1")
    with sb_client(sb_broker) as client:
        with peek_lock_receiver(client, "work") as receiver:
            receiver.dead_letter_message(
                receive_one(receiver), reason="BadInput", error_description="cannot parse"
            )
        assert sb_broker.active_count("work") == 0
        (info,) = sb_broker.messages("work", DEAD_LETTER)
        assert (info.dead_letter_reason, info.dead_letter_error_description) == (
            "BadInput", "cannot parse")

        with peek_lock_receiver(client, "work", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            dead = receive_one(dlq)
            assert dead.dead_letter_reason == "BadInput"
            assert dead.dead_letter_error_description == "cannot parse"
            assert dead.message_id == "p-1"
            with client.get_queue_sender("work") as sender:
                sender.send_messages(ServiceBusMessage(b"".join(dead.body), message_id="p-1"))
            dlq.complete_message(dead)
        assert sb_broker.dead_letter_count("work") == 0
        with peek_lock_receiver(client, "work") as receiver:
            again = receive_one(receiver)
            assert (str(again), again.delivery_count, again.dead_letter_reason) == (
                "poison", 0, None)
            receiver.complete_message(again)


def test_max_delivery_count_moves_to_dead_letter(sb_broker: ServiceBusTestBroker) -> None:
    sb_broker.create_queue("work", max_delivery_count=2, lock_duration=1)
    sb_broker.send("work", b"doomed")
    with sb_client(sb_broker) as client:
        with peek_lock_receiver(client, "work") as receiver:
            receiver.abandon_message(receive_one(receiver))
            assert receive_one(receiver).delivery_count == 1  # lock left to expire
            sb_broker.wait_for(lambda: sb_broker.dead_letter_count("work") == 1, timeout=5,
                               message="dead-lettering")
        assert sb_broker.active_count("work") == 0
        with peek_lock_receiver(client, "work", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            dead = receive_one(dlq)
            assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
            assert dead.delivery_count == 2
            dlq.complete_message(dead)


def test_peek_does_not_lock(sb_broker: ServiceBusTestBroker) -> None:
    for body in ("a", "b", "c"):
        sb_broker.send("work", body)
    with work_receiver(sb_broker) as receiver:
        peeked = receiver.peek_messages(max_message_count=10)
        assert [(str(m), m.sequence_number) for m in peeked] == [("a", 1), ("b", 2), ("c", 3)]
        assert sb_broker.locked_count("work") == 0
        assert [str(m) for m in receiver.peek_messages(max_message_count=2,
                                                       sequence_number=2)] == ["b", "c"]
        msg = receive_one(receiver)
        assert (str(msg), msg.delivery_count) == ("a", 0)
        receiver.complete_message(msg)
    assert sb_broker.events("deliver")[0].seq == 1


def test_freeze_blocks_requests_and_unfreeze_restores(sb_broker: ServiceBusTestBroker) -> None:
    sb_broker.send("work", b"job")
    with sb_client(sb_broker, retry_total=0) as client:
        with peek_lock_receiver(client, "work") as receiver:
            msg = receive_one(receiver)
            receiver.renew_message_lock(msg)  # management link is up
            sb_broker.freeze()
            started = time.monotonic()
            with pytest.raises((ServiceBusError, TimeoutError)):
                receiver.renew_message_lock(msg, timeout=2)
            assert time.monotonic() - started < 15
            assert len(sb_broker.events("renew")) == 1
            sb_broker.unfreeze()
    with work_receiver(sb_broker) as receiver:
        assert [str(m) for m in receiver.peek_messages(max_message_count=5)] == ["job"]
        sb_broker.expire_locks("work")
        receiver.complete_message(receive_one(receiver))
    assert sb_broker.active_count("work") == 0


def test_prefetch_zero_credit_is_honoured(sb_broker: ServiceBusTestBroker) -> None:
    for i in range(5):
        sb_broker.send("work", f"m{i}")
    with sb_client(sb_broker) as client:
        with peek_lock_receiver(client, "work") as one, peek_lock_receiver(client, "work") as two:
            a = receive_one(one)
            b = receive_one(two)
            assert a.sequence_number != b.sequence_number
            assert sb_broker.locked_count("work") == 2
            pair = one.receive_messages(max_message_count=2, max_wait_time=5)
            assert len(pair) == 2
            assert sb_broker.locked_count("work") == 4
            assert len(sb_broker.events("deliver")) == 4
            c = receive_one(two)
            seqs = {m.sequence_number for m in (a, b, c, *pair)}
            assert seqs == {1, 2, 3, 4, 5}
            for receiver, msgs in ((one, (a, *pair)), (two, (b, c))):
                for m in msgs:
                    receiver.complete_message(m)
    assert sb_broker.active_count("work") == 0
    assert len(sb_broker.events("deliver")) == 5


def test_batch_large_message_and_receive_and_delete(sb_broker: ServiceBusTestBroker) -> None:
    big = bytes(range(256)) * 1024  # 256 KiB: several frames each way
    with sb_client(sb_broker) as client:
        with client.get_queue_sender("work") as sender:
            sender.send_messages([ServiceBusMessage("x"), ServiceBusMessage("y")])
            sender.send_messages(ServiceBusMessage(big))
        assert [m.body for m in sb_broker.messages("work")] == [b"x", b"y", big]
        with client.get_queue_receiver(
            "work", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, prefetch_count=0
        ) as receiver:
            got: list = []
            deadline = time.monotonic() + 10
            while len(got) < 3 and time.monotonic() < deadline:
                got += receiver.receive_messages(max_message_count=3, max_wait_time=2)
            assert [b"".join(m.body) for m in got] == [b"x", b"y", big]
    assert sb_broker.active_count("work") == 0


def test_unknown_queue_is_not_found_without_auto_create() -> None:
    from azure.servicebus.exceptions import MessagingEntityNotFoundError

    with ServiceBusTestBroker(auto_create_queues=False) as broker:
        broker.create_queue("known")
        with sb_client(broker, retry_total=0) as client:
            with client.get_queue_sender("known") as sender:
                sender.send_messages(ServiceBusMessage("ok"))
            with pytest.raises(MessagingEntityNotFoundError):
                with client.get_queue_sender("missing") as sender:
                    sender.send_messages(ServiceBusMessage("lost"))
        assert broker.active_count("known") == 1


def test_stop_closes_connections_thread_and_port() -> None:
    broker = ServiceBusTestBroker().start()
    port = broker.port
    with sb_client(broker) as client, client.get_queue_sender("work") as sender:
        sender.send_messages(ServiceBusMessage("x"))
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        broker.wait_for(lambda: broker.connection_count() == 1, timeout=5,
                        message="only the raw connection left")
        broker.stop()
        assert raw.recv(1) == b""  # closed by the broker
    finally:
        raw.close()
    assert not [t for t in threading.enumerate() if t.name == f"sb-test-broker-{port}"]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    broker.stop()  # idempotent
