"""Request/response nodes of the test broker: ``$cbs`` and ``<entity>/$management``.

Called from the broker thread, with the broker lock held, for every request message that
arrives on a management or CBS request link.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from azure.servicebus._pyamqp.message import Message
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes

from . import _amqp
from ._store import LOCK_LOST, Entity, Store

_LOGGER = logging.getLogger(__name__)

_SETTLEMENTS = {
    "completed": "complete",
    "abandoned": "abandon",
    "suspended": "deadletter",
    "defered": "abandon",  # deferral is not supported; treated as abandon
}


def _response(request: Message, status: int, description: str, value: Any = None,
              condition: Optional[str] = None, cbs: bool = False) -> bytes:
    if cbs:
        props: dict[str, Any] = {"status-code": status, "status-description": description}
    else:
        props = {"statusCode": status, "statusDescription": description}
        if condition:
            props["errorCondition"] = _amqp.symbol(condition)
    correlation_id = request.properties.message_id if request.properties else None
    return _amqp.build_response_payload(correlation_id, props, value)


def _lock_lost(request: Message) -> bytes:
    return _response(
        request,
        410,
        "The lock supplied is invalid. Either the lock expired, or the message has already "
        "been removed from the queue.",
        condition=LOCK_LOST,
    )


def handle_request(store: Store, kind: str, entity: Optional[Entity], request: Message) -> bytes:
    """Serve one request; return the encoded response message."""
    if kind == "cbs":
        return _response(request, 200, "OK", cbs=True)
    assert entity is not None
    props = request.application_properties or {}
    operation = _amqp.text(props.get(b"operation"))
    body = request.value if isinstance(request.value, dict) else {}
    if operation == "com.microsoft:renew-lock":
        expirations: list[dict[str, Any]] = []
        for token in body.get(b"lock-tokens") or []:
            locked_until = store.renew(token, entity)
            if locked_until is None:
                return _lock_lost(request)
            expirations.append(_amqp.timestamp(locked_until))
        value = {"expirations": {TYPE: AMQPTypes.array, VALUE: expirations}}
        return _response(request, 200, "OK", value)
    if operation == "com.microsoft:peek-message":
        from_seq = int(body.get(b"from-sequence-number") or 1)
        count = int(body.get(b"message-count") or 1)
        payloads = store.peek(entity, from_seq, count)
        if not payloads:
            return _response(request, 204, "No messages")
        return _response(request, 200, "OK", {"messages": [{"message": p} for p in payloads]})
    if operation == "com.microsoft:update-disposition":
        status = _amqp.text(body.get(b"disposition-status"))
        outcome = _SETTLEMENTS.get(status)
        if outcome is None:
            return _response(request, 400, f"unknown disposition {status!r}",
                             condition="amqp:invalid-field")
        for token in body.get(b"lock-tokens") or []:
            settled = store.settle(
                token,
                outcome,
                reason=_amqp.text(body.get(b"deadletter-reason")),
                description=_amqp.text(body.get(b"deadletter-description")),
                entity=entity,
            )
            if not settled:
                return _lock_lost(request)
        return _response(request, 200, "OK")
    _LOGGER.info("test broker: unsupported management operation %r", operation)
    return _response(request, 501, f"operation {operation!r} is not supported by the test broker",
                     condition="amqp:not-implemented")
