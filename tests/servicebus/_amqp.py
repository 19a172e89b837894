"""AMQP 1.0 wire helpers for the Service Bus test broker.

Everything here is a pure function or a small single-owner object; nothing starts threads.
The broker thread is the only caller in practice (the test thread only uses
:func:`build_message_payload` and :func:`decode_message` through the broker's hooks, under
the broker lock).

The codec itself is the SDK's private ``azure.servicebus._pyamqp`` codec (``_encode`` /
``_decode``), which is why ``azure-servicebus`` is pinned to 7.15.0.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple, Optional

from azure.servicebus._pyamqp import _decode, _encode
from azure.servicebus._pyamqp.message import Header, Message, Properties
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"

FRAME_TYPE_AMQP = 0
FRAME_TYPE_SASL = 1

# Performative descriptor codes.
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)

# Message section descriptor codes.
SEC_HEADER = 0x70
SEC_DELIVERY_ANNOTATIONS = 0x71
SEC_MESSAGE_ANNOTATIONS = 0x72
SEC_PROPERTIES = 0x73
SEC_APPLICATION_PROPERTIES = 0x74
SEC_DATA = 0x75
SEC_AMQP_SEQUENCE = 0x76
SEC_AMQP_VALUE = 0x77
SEC_FOOTER = 0x78

#: message-format of a Service Bus batch: every data section is one encoded message.
BATCH_MESSAGE_FORMAT = 0x80013700


def encode_frame(
    channel: int, performative: NamedTuple, frame_type: int = FRAME_TYPE_AMQP
) -> bytes:
    """Encode one performative (a ``_pyamqp`` frame namedtuple) as a complete frame."""
    header, body = _encode.encode_frame(performative, frame_type=bytes([frame_type]))
    return header + struct.pack(">H", channel) + (body or b"")


class Frame(NamedTuple):
    """One decoded frame: ``code`` is the performative code, ``fields`` its field values."""

    channel: int
    frame_type: int
    code: int
    fields: list[Any]


class FrameReader:
    """Incremental parser of an AMQP byte stream (protocol headers and frames).

    ``expect_header`` is set by the owner whenever the peer is due to send a protocol header
    (at the start, and again after a successful SASL exchange).
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.expect_header = True

    def feed(self, data: bytes) -> None:
        self._buf.extend(data)

    def items(self) -> Iterator[Any]:
        """Yield protocol headers (``bytes``) and :class:`Frame` objects as they complete."""
        while True:
            if self.expect_header:
                if len(self._buf) < 8:
                    return
                header = bytes(self._buf[:8])
                del self._buf[:8]
                self.expect_header = False
                yield header
                continue
            if len(self._buf) < 8:
                return
            size = struct.unpack(">I", self._buf[:4])[0]
            if size < 8:
                raise ValueError(f"invalid frame size {size}")
            if len(self._buf) < size:
                return
            raw = bytes(self._buf[:size])
            del self._buf[:size]
            doff = raw[4] * 4
            frame_type = raw[5]
            channel = struct.unpack(">H", raw[6:8])[0]
            body = raw[doff:]
            if not body:  # empty (heartbeat) frame
                continue
            code, fields = _decode.decode_frame(memoryview(body))
            if code == TRANSFER:
                fields[-1] = bytes(fields[-1])
            yield Frame(channel, frame_type, code, fields)


# ---------------------------------------------------------------------------------------------
# Message sections


class Section(NamedTuple):
    """One message section: descriptor code, its exact wire bytes, and its decoded value."""

    code: int
    raw: bytes
    value: Any


def split_sections(payload: bytes) -> list[Section]:
    """Split an encoded message into its sections, keeping each section's original bytes."""
    buf = memoryview(payload)
    sections: list[Section] = []
    while buf:
        if buf[0] != 0x00:
            raise ValueError("message section is not a described type")
        if buf[1] == 0x53:  # smallulong descriptor
            code, start = buf[2], 3
        elif buf[1] == 0x80:  # ulong descriptor
            code, start = struct.unpack(">Q", buf[2:10])[0], 10
        else:
            raise ValueError(f"unsupported section descriptor constructor 0x{buf[1]:02x}")
        rest, value = _decode._DECODE_BY_CONSTRUCTOR[buf[start]](buf[start + 1 :])
        used = len(buf) - len(rest)
        sections.append(Section(code, bytes(buf[:used]), value))
        buf = rest
    return sections


def _map_elements(raw_section: Optional[bytes]) -> tuple[int, bytes]:
    """Return (element count, encoded elements) of the map inside a raw map section."""
    if not raw_section:
        return 0, b""
    body = raw_section[3:] if raw_section[1] == 0x53 else raw_section[10:]
    constructor = body[0]
    if constructor == 0x40:  # null
        return 0, b""
    if constructor == 0xC1:
        size, count = body[1], body[2]
        return count, body[3 : 2 + size]
    if constructor == 0xD1:
        size, count = struct.unpack(">II", body[1:9])
        return count, body[9 : 5 + size]
    raise ValueError(f"unexpected map constructor 0x{constructor:02x}")


def merge_map_section(
    code: int, raw_section: Optional[bytes], extra: list[tuple[Any, Any]]
) -> bytes:
    """Re-encode a map section (annotations / application properties) with extra entries.

    The original entries keep their exact encoding; ``extra`` holds ``(key, value)`` pairs in
    the ``_pyamqp`` encoder's ``{TYPE:..., VALUE:...}`` form. Later entries win on decoding, so
    extra keys override earlier ones.
    """
    count, elements = _map_elements(raw_section)
    out = bytearray(elements)
    for key, value in extra:
        _encode.encode_value(out, key)
        _encode.encode_value(out, value)
    count += 2 * len(extra)
    section = bytearray(b"\x00\x53" + bytes([code]))
    if count <= 255 and len(out) + 1 <= 255:
        section += bytes([0xC1, len(out) + 1, count])
    else:
        section += b"\xd1" + struct.pack(">II", len(out) + 4, count)
    section += out
    return bytes(section)


def encode_header_section(fields: list[Any], delivery_count: int) -> bytes:
    """Encode a header section from the original header fields with a new delivery count."""
    values = (list(fields or []) + [None] * 5)[:5]
    values[3] = delivery_count == 0  # first-acquirer
    values[4] = delivery_count
    out = bytearray()
    _encode.encode_value(out, _encode.describe_performative(Header(*values)))
    return bytes(out)


def symbol(value: str) -> dict[str, Any]:
    return {TYPE: AMQPTypes.symbol, VALUE: value.encode()}


def string(value: str) -> dict[str, Any]:
    return {TYPE: AMQPTypes.string, VALUE: value}


def timestamp(ms: int) -> dict[str, Any]:
    return {TYPE: AMQPTypes.timestamp, VALUE: int(ms)}


def long(value: int) -> dict[str, Any]:
    return {TYPE: AMQPTypes.long, VALUE: int(value)}


def uuid_value(value: uuid.UUID) -> dict[str, Any]:
    return {TYPE: AMQPTypes.uuid, VALUE: value}


def build_message_payload(
    body: bytes,
    message_id: Optional[str] = None,
    application_properties: Optional[dict[str, Any]] = None,
) -> bytes:
    """Encode a simple data-body message, as the SDK's sender would."""
    message = Message(
        data=[body],
        properties=Properties(message_id=message_id) if message_id is not None else None,
        application_properties=dict(application_properties) if application_properties else None,  # type: ignore[arg-type]
    )
    return bytes(_encode.encode_payload(bytearray(), message))


def build_response_payload(
    correlation_id: Any, application_properties: dict[str, Any], value: Any = None
) -> bytes:
    """Encode a management / CBS response message."""
    message = Message(
        properties=Properties(message_id=uuid.uuid4(), correlation_id=correlation_id),
        application_properties=application_properties,  # type: ignore[arg-type]
        value=value,
    )
    return bytes(_encode.encode_payload(bytearray(), message))


def decode_message(payload: bytes) -> Message:
    """Decode an encoded message with the SDK decoder."""
    return _decode.decode_payload(memoryview(payload))


def split_batch(payload: bytes) -> list[bytes]:
    """Return the encoded messages held in the data sections of a batch message."""
    return [bytes(s.value) for s in split_sections(payload) if s.code == SEC_DATA]


def text(value: Any) -> Any:
    """Decode ``bytes`` (how the SDK decoder returns strings and symbols) to ``str``."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    return value
