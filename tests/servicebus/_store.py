"""Queue state of the Service Bus test broker: messages, locks, settlement, the event log.

No I/O and no threads here. Every method must be called with the broker lock held: from the
broker thread (protocol handling, lock-expiry ticks) or from the test thread (inspection and
manipulation hooks of ``ServiceBusTestBroker`` in broker.py).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from . import _amqp

LOCK_LOST = "com.microsoft:message-lock-lost"
MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
DLQ_SUFFIX = "$deadletterqueue"
SCHEDULED = b"x-opt-scheduled-enqueue-time"


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Event:
    """One entry of the broker's event log.

    ``kind`` is one of: ``enqueue``, ``deliver``, ``complete``, ``abandon``, ``release``,
    ``deadletter``, ``lock_expired``, ``renew``, ``renew_failed``, ``settle_lock_lost``,
    ``peek``. ``queue`` is the entity path (``name`` or ``name/$deadletterqueue``).
    ``time`` is ``time.monotonic()``, ``wall`` is ``time.time()``.
    """

    kind: str
    queue: str
    seq: Optional[int] = None
    lock_token: Optional[uuid.UUID] = None
    delivery_count: Optional[int] = None
    time: float = 0.0
    wall: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MessageInfo:
    """Snapshot of a stored message, for tests to assert on."""

    seq: int
    message_id: Optional[str]
    body: Any
    application_properties: dict[Any, Any]
    delivery_count: int
    locked: bool
    lock_token: Optional[uuid.UUID]
    locked_until: Optional[float]
    dead_letter_reason: Optional[str]
    dead_letter_error_description: Optional[str]
    enqueued_time: float


class StoredMessage:
    """A message held by the broker; keeps the sender's sections byte-for-byte."""

    def __init__(self, seq: int, payload: bytes) -> None:
        self.seq = seq
        self.enqueued_ms = wall_ms()
        self.available_ms = 0  # a scheduled message is not delivered before this (wall ms)
        self.delivery_count = 0
        self.lock: Optional[LockRecord] = None
        self.header_fields: list[Any] = []
        self.annotations_raw: Optional[bytes] = None
        self.properties_raw: Optional[bytes] = None
        self.app_props_raw: Optional[bytes] = None
        self.message_id: Optional[str] = None
        self.app_props: dict[Any, Any] = {}
        self.dead_letter_reason: Optional[str] = None
        self.dead_letter_description: Optional[str] = None
        body: list[bytes] = []
        for section in _amqp.split_sections(payload):
            if section.code == _amqp.SEC_HEADER:
                self.header_fields = list(section.value or [])
            elif section.code == _amqp.SEC_MESSAGE_ANNOTATIONS:
                self.annotations_raw = section.raw
                scheduled = dict(section.value or {}).get(SCHEDULED)
                if scheduled is not None:  # an int of ms, or a datetime from the codec
                    self.available_ms = (int(scheduled.timestamp() * 1000)
                                         if hasattr(scheduled, "timestamp") else int(scheduled))
            elif section.code == _amqp.SEC_PROPERTIES:
                self.properties_raw = section.raw
                if section.value:
                    self.message_id = _amqp.text(section.value[0])
            elif section.code == _amqp.SEC_APPLICATION_PROPERTIES:
                self.app_props_raw = section.raw
                self.app_props = dict(section.value or {})
            elif section.code != _amqp.SEC_DELIVERY_ANNOTATIONS:
                body.append(section.raw)
        self.body_raw = b"".join(body)

    def payload(self, lock_token: Optional[uuid.UUID] = None, locked_until_ms: int = 0) -> bytes:
        """Encode the message as delivered (with the broker's header and annotations)."""
        extra: list[tuple[Any, Any]] = [
            (_amqp.symbol("x-opt-sequence-number"), _amqp.long(self.seq)),
            (_amqp.symbol("x-opt-enqueued-time"), _amqp.timestamp(self.enqueued_ms)),
        ]
        if lock_token is not None:
            extra.append((_amqp.symbol("x-opt-lock-token"), _amqp.uuid_value(lock_token)))
            extra.append((_amqp.symbol("x-opt-locked-until"), _amqp.timestamp(locked_until_ms)))
        return b"".join(
            (
                _amqp.encode_header_section(self.header_fields, self.delivery_count),
                _amqp.merge_map_section(_amqp.SEC_MESSAGE_ANNOTATIONS, self.annotations_raw, extra),
                self.properties_raw or b"",
                self.app_props_raw or b"",
                self.body_raw,
            )
        )

    def mark_dead_lettered(self, reason: Optional[str], description: Optional[str]) -> None:
        """Record the dead-letter reason the way Service Bus does (application properties)."""
        self.dead_letter_reason = reason
        self.dead_letter_description = description
        extra = []
        if reason is not None:
            extra.append((_amqp.string("DeadLetterReason"), _amqp.string(reason)))
            self.app_props[b"DeadLetterReason"] = reason.encode()
        if description is not None:
            extra.append((_amqp.string("DeadLetterErrorDescription"), _amqp.string(description)))
            self.app_props[b"DeadLetterErrorDescription"] = description.encode()
        if extra:
            self.app_props_raw = _amqp.merge_map_section(
                _amqp.SEC_APPLICATION_PROPERTIES, self.app_props_raw, extra
            )

    def info(self) -> MessageInfo:
        decoded = _amqp.decode_message(self.payload())
        if decoded.data:
            body: Any = b"".join(bytes(d) for d in decoded.data)
        elif decoded.sequence:
            body = decoded.sequence
        else:
            body = decoded.value
        lock = self.lock
        return MessageInfo(
            seq=self.seq,
            message_id=self.message_id,
            body=body,
            application_properties={
                _amqp.text(k): _amqp.text(v) for k, v in self.app_props.items()
            },
            delivery_count=self.delivery_count,
            locked=lock is not None,
            lock_token=lock.token if lock else None,
            locked_until=lock.locked_until_ms / 1000.0 if lock else None,
            dead_letter_reason=self.dead_letter_reason,
            dead_letter_error_description=self.dead_letter_description,
            enqueued_time=self.enqueued_ms / 1000.0,
        )


@dataclass
class LockRecord:
    token: uuid.UUID
    entity: Entity
    message: StoredMessage
    expires: float  # time.monotonic()
    locked_until_ms: int  # wall clock, as reported to clients


class Entity:
    """A queue or its dead-letter sub-queue. ``links`` are the broker-side sender links."""

    def __init__(self, queue: Queue, path: str, is_dlq: bool) -> None:
        self.queue = queue
        self.path = path
        self.is_dlq = is_dlq
        self.messages: dict[int, StoredMessage] = {}
        self.links: list[Any] = []

    def next_available(self) -> Optional[StoredMessage]:
        now = wall_ms()
        for message in self.messages.values():
            if message.lock is None and message.available_ms <= now:
                return message
        return None


class Queue:
    def __init__(self, name: str, lock_duration: float, max_delivery_count: int) -> None:
        self.name = name
        self.lock_duration = lock_duration
        self.max_delivery_count = max_delivery_count
        self.main = Entity(self, name, is_dlq=False)
        self.dlq = Entity(self, f"{name}/{DLQ_SUFFIX}", is_dlq=True)
        self.next_seq = 1
        # duplicate detection (off at 0): a message id seen within this many seconds is
        # dropped on enqueue, as Service Bus does when the queue has it enabled
        self.duplicate_window = 0.0
        self.seen_ids: dict[str, float] = {}  # message id -> time.monotonic() of its enqueue


class Store:
    """All queues, locks and the event log."""

    def __init__(
        self, lock_duration: float, max_delivery_count: int, auto_create: bool
    ) -> None:
        self.default_lock_duration = lock_duration
        self.default_max_delivery_count = max_delivery_count
        self.auto_create = auto_create
        self.queues: dict[str, Queue] = {}
        self.locks: dict[uuid.UUID, LockRecord] = {}
        self.events: list[Event] = []
        self.fail_all_renewals = False
        self.fail_renewal_tokens: set = set()

    # -- entities -------------------------------------------------------------------------

    def queue(self, name: str, create: bool = True) -> Optional[Queue]:
        key = name.lower()
        queue = self.queues.get(key)
        if queue is None and create:
            queue = Queue(key, self.default_lock_duration, self.default_max_delivery_count)
            self.queues[key] = queue
        return queue

    def resolve(self, path: str) -> Optional[Entity]:
        """Map ``name`` or ``name/$DeadLetterQueue`` (any case) to an entity."""
        parts = path.strip("/").split("/")
        if not parts[0] or len(parts) > 2:
            return None
        queue = self.queue(parts[0], create=self.auto_create)
        if queue is None:
            return None
        if len(parts) == 1:
            return queue.main
        return queue.dlq if parts[1].lower() == DLQ_SUFFIX else None

    def record(self, kind: str, entity: Entity, message: Optional[StoredMessage] = None,
               token: Optional[uuid.UUID] = None, **detail: Any) -> None:
        self.events.append(
            Event(
                kind=kind,
                queue=entity.path,
                seq=message.seq if message else None,
                lock_token=token,
                delivery_count=message.delivery_count if message else None,
                time=time.monotonic(),
                wall=time.time(),
                detail=detail,
            )
        )

    # -- messages -------------------------------------------------------------------------

    def enqueue(self, entity: Entity, payload: bytes) -> StoredMessage:
        queue = entity.queue
        message = StoredMessage(queue.next_seq, payload)
        if queue.duplicate_window and message.message_id is not None and not entity.is_dlq:
            now = time.monotonic()
            seen = queue.seen_ids.get(message.message_id)
            if seen is not None and now - seen < queue.duplicate_window:
                self.record("duplicate", entity, message, message_id=message.message_id)
                return message  # accepted and dropped: the sender cannot tell
            queue.seen_ids[message.message_id] = now
        queue.next_seq += 1
        entity.messages[message.seq] = message
        self.record("enqueue", entity, message, message_id=message.message_id)
        return message

    def lock(self, entity: Entity, message: StoredMessage) -> LockRecord:
        duration = entity.queue.lock_duration
        record = LockRecord(
            token=uuid.uuid4(),
            entity=entity,
            message=message,
            expires=time.monotonic() + duration,
            locked_until_ms=wall_ms() + int(duration * 1000),
        )
        message.lock = record
        self.locks[record.token] = record
        return record

    def remove(self, entity: Entity, message: StoredMessage) -> None:
        entity.messages.pop(message.seq, None)
        if message.lock is not None:
            self.locks.pop(message.lock.token, None)
            message.lock = None

    def _unlock(self, record: LockRecord) -> None:
        self.locks.pop(record.token, None)
        if record.message.lock is record:
            record.message.lock = None

    def _return_to_queue(self, record: LockRecord, count_delivery: bool) -> None:
        """Make a locked message available again; dead-letter it past max delivery count."""
        self._unlock(record)
        message, entity = record.message, record.entity
        if not count_delivery:
            return
        message.delivery_count += 1
        if not entity.is_dlq and message.delivery_count >= entity.queue.max_delivery_count:
            self.dead_letter(
                entity,
                message,
                MAX_DELIVERY_REASON,
                f"Message could not be consumed after {entity.queue.max_delivery_count} "
                "delivery attempts.",
                record.token,
            )

    def dead_letter(self, entity: Entity, message: StoredMessage, reason: Optional[str],
                    description: Optional[str], token: Optional[uuid.UUID] = None) -> None:
        self.remove(entity, message)
        target = entity if entity.is_dlq else entity.queue.dlq
        message.mark_dead_lettered(reason, description)
        target.messages[message.seq] = message
        self.record("deadletter", entity, message, token, reason=reason, description=description)

    def live_lock(self, token: uuid.UUID) -> Optional[LockRecord]:
        """The lock for ``token`` if it is still held (expiring it first if due)."""
        record = self.locks.get(token)
        if record is not None and record.expires <= time.monotonic():
            self.expire(record)
            return None
        return record

    def expire(self, record: LockRecord) -> None:
        self.record("lock_expired", record.entity, record.message, record.token)
        self._return_to_queue(record, count_delivery=True)

    def expire_due(self) -> None:
        now = time.monotonic()
        for record in [r for r in self.locks.values() if r.expires <= now]:
            self.expire(record)

    def settle(self, token: Optional[uuid.UUID], outcome: str, *, delivery_failed: bool = True,
               reason: Optional[str] = None, description: Optional[str] = None,
               entity: Optional[Entity] = None) -> bool:
        """Apply ``complete``/``abandon``/``release``/``deadletter``; False if the lock is lost."""
        record = self.live_lock(token) if token is not None else None
        if record is None:
            if entity is not None:
                self.record("settle_lock_lost", entity, token=token, outcome=outcome)
            return False
        message, entity = record.message, record.entity
        if outcome == "complete":
            self.remove(entity, message)
            self.record("complete", entity, message, token)
        elif outcome == "deadletter":
            self.dead_letter(entity, message, reason, description, token)
        elif outcome == "release":
            self.record("release", entity, message, token)
            self._return_to_queue(record, count_delivery=False)
        else:
            self.record("abandon", entity, message, token)
            self._return_to_queue(record, count_delivery=delivery_failed)
        return True

    def renew(self, token: uuid.UUID, entity: Entity) -> Optional[int]:
        """Extend a lock; the new locked-until (wall ms), or None if the lock is lost."""
        record = self.live_lock(token)
        if self.fail_all_renewals or token in self.fail_renewal_tokens:
            self.record("renew_failed", entity, record.message if record else None, token,
                        injected=True)
            return None
        if record is None:
            self.record("renew_failed", entity, token=token, injected=False)
            return None
        duration = record.entity.queue.lock_duration
        record.expires = time.monotonic() + duration
        record.locked_until_ms = wall_ms() + int(duration * 1000)
        self.record("renew", record.entity, record.message, token,
                    locked_until=record.locked_until_ms / 1000.0)
        return record.locked_until_ms

    def peek(self, entity: Entity, from_seq: int, count: int) -> list[bytes]:
        messages = sorted((m for m in entity.messages.values() if m.seq >= from_seq),
                          key=lambda m: m.seq)[: max(count, 0)]
        self.record("peek", entity, from_seq=from_seq, count=len(messages))
        return [m.payload() for m in messages]
