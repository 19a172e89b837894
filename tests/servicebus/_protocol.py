"""AMQP 1.0 server side of one client connection: SASL, sessions, links, deliveries.

All methods run on the broker thread with the broker lock held. Outgoing bytes are only
appended to :attr:`Connection.outbuf`; the broker thread's socket loop writes them out.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable
from typing import Any, Optional

from azure.servicebus._pyamqp import performatives as pf
from azure.servicebus._pyamqp.endpoints import Source, Target
from azure.servicebus._pyamqp.error import AMQPError
from azure.servicebus._pyamqp.outcomes import Accepted, Modified, Rejected, Released

from . import _amqp, _mgmt
from ._store import Entity, Store

_LOGGER = logging.getLogger(__name__)

MAX_FRAME_SIZE = 65536
MAX_MESSAGE_SIZE = 1024 * 1024
SESSION_WINDOW = 2**31 - 1
RECEIVER_CREDIT = 1000  # credit granted to client sender links
HANDLE_MAX = 65535


def normalize_address(address: Optional[str]) -> str:
    """``amqps://host:port/q/$DeadLetterQueue`` -> ``q/$DeadLetterQueue``."""
    path = address or ""
    if "://" in path:
        path = path.split("://", 1)[1]
        path = path.split("/", 1)[1] if "/" in path else ""
    return path.strip("/")


class Link:
    """One attached link. ``broker_sends`` is True when the client is the receiver."""

    def __init__(self, session: Session, name: bytes, handle: int, broker_sends: bool,
                 address: str, kind: str, entity: Optional[Entity], snd_settle_mode: int) -> None:
        self.session = session
        self.name = name
        self.handle = handle
        self.broker_sends = broker_sends
        self.address = address
        self.kind = kind  # "queue", "mgmt" or "cbs"
        self.entity = entity
        self.settled_deliveries = snd_settle_mode == 1  # receive-and-delete
        self.delivery_count = 0
        self.credit = 0
        self.drain = False
        self.last_served = 0.0
        self.responses: deque[bytes] = deque()
        self.partial: Optional[bytearray] = None
        self.partial_first: Optional[list[Any]] = None


class Session:
    """One AMQP session; the broker answers on the same channel number the client used."""

    def __init__(self, conn: Connection, channel: int, next_incoming_id: int) -> None:
        self.conn = conn
        self.channel = channel
        self.next_incoming_id = next_incoming_id
        self.next_outgoing_id = 0
        self.next_delivery_id = 0
        self.links: dict[int, Link] = {}  # by the client's handle
        # delivery id -> (lock token, entity) of deliveries awaiting the client's outcome
        self.unsettled: dict[int, tuple[uuid.UUID, Entity]] = {}
        self._handles = 0

    def send(self, performative: Any) -> None:
        self.conn.send(self.channel, performative)

    def flow(self, link: Link, drain: bool = False) -> None:
        self.send(pf.FlowFrame(
            next_incoming_id=self.next_incoming_id, incoming_window=SESSION_WINDOW,
            next_outgoing_id=self.next_outgoing_id, outgoing_window=SESSION_WINDOW,
            handle=link.handle, delivery_count=link.delivery_count, link_credit=link.credit,
            available=None, drain=drain, echo=False, properties=None,
        ))

    def transfer(self, link: Link, tag: bytes, payload: bytes, settled: bool) -> int:
        """Send one delivery (split over frames if needed); returns its delivery id."""
        delivery_id = self.next_delivery_id
        self.next_delivery_id += 1

        def frame(chunk: bytes, more: bool) -> pf.TransferFrame:
            return pf.TransferFrame(handle=link.handle, delivery_id=delivery_id, delivery_tag=tag,
                                    message_format=0, settled=settled, more=more, payload=chunk)

        room = self.conn.remote_max_frame - len(_amqp.encode_frame(0, frame(b"", True)))
        room = max(room, 64)
        while True:
            chunk, payload = payload[:room], payload[room:]
            self.send(frame(chunk, bool(payload)))
            self.next_outgoing_id += 1
            if not payload:
                break
        link.delivery_count += 1
        link.credit -= 1
        link.last_served = time.monotonic()
        return delivery_id

    # -- incoming performatives -----------------------------------------------------------

    def on_attach(self, f: list[Any]) -> None:
        name, client_handle, role, snd_mode, rcv_mode, source, target = f[:7]
        broker_sends = bool(role)
        terminus = source if broker_sends else target
        address = normalize_address(_amqp.text(terminus[0]) if terminus else None)
        kind, entity = "queue", None
        if address.lower() == "$cbs":
            kind = "cbs"
        elif address.lower().endswith("/$management"):
            kind = "mgmt"
            entity = self.conn.store.resolve(address[: -len("/$management")])
        else:
            entity = self.conn.store.resolve(address)
        handle = self._handles
        self._handles += 1
        refused = kind != "cbs" and entity is None
        # Refusing a link (AMQP 2.6.3): null terminus on the broker's side, then detach.
        if refused and broker_sends:
            source = None
        elif refused:
            target = None
        self.send(pf.AttachFrame(
            name=name, handle=handle, role=not broker_sends, send_settle_mode=snd_mode,
            rcv_settle_mode=rcv_mode,
            source=Source(address=source[0]) if source else None,  # type: ignore[call-arg]
            target=Target(address=target[0]) if target else None,  # type: ignore[call-arg]
            unsettled=None,
            incomplete_unsettled=None, initial_delivery_count=0 if broker_sends else None,
            max_message_size=MAX_MESSAGE_SIZE, offered_capabilities=None,
            desired_capabilities=None, properties=None,
        ))
        if refused:
            self.send(pf.DetachFrame(handle=handle, closed=True, error=AMQPError(
                condition=b"amqp:not-found",
                description=f"The messaging entity '{address}' could not be found.",
            )))
            return
        link = Link(self, name, handle, broker_sends, address.lower(), kind, entity, snd_mode)
        self.links[client_handle] = link
        if broker_sends and kind == "queue":
            assert entity is not None
            entity.links.append(link)
        if not broker_sends:
            link.delivery_count = f[9] or 0
            link.credit = RECEIVER_CREDIT
            self.flow(link)

    def on_flow(self, f: list[Any]) -> None:
        link = self.links.get(f[4]) if f[4] is not None else None
        if link is None:
            return
        if link.broker_sends and f[6] is not None:
            remote_count = f[5] if f[5] is not None else link.delivery_count
            link.credit = max(0, remote_count + f[6] - link.delivery_count)
            link.drain = bool(f[8])
        if f[9]:  # echo
            self.flow(link)

    def on_transfer(self, f: list[Any]) -> None:
        self.next_incoming_id += 1
        link = self.links.get(f[0])
        if link is None:  # e.g. pipelined after an attach the broker refused; drop it
            _LOGGER.debug("test broker: transfer on unattached handle %r", f[0])
            return
        if link.broker_sends:
            raise ValueError("transfer on a link where the broker is the sender")
        if link.partial is None:
            link.partial, link.partial_first = bytearray(), f
        link.partial += f[11]
        if f[5]:  # more
            return
        payload, first = bytes(link.partial), link.partial_first
        link.partial = link.partial_first = None
        assert first is not None
        link.delivery_count += 1
        link.credit -= 1
        state = self.conn.on_message(link, payload, first[3] or 0)
        if not first[4]:  # not settled by the client
            self.send(pf.DispositionFrame(role=True, first=first[1], last=None, settled=True,
                                          state=state, batchable=None))
        if link.credit < RECEIVER_CREDIT // 2:
            link.credit = RECEIVER_CREDIT
            self.flow(link)

    def on_disposition(self, f: list[Any]) -> None:
        role, first, last, settled, state = f[:5]
        if not role or not state:  # only the client's receiver-side outcomes matter
            return
        last = first if last is None else last
        ids = [i for i in self.unsettled if first <= i <= last]
        for delivery_id in ids:
            token, entity = self.unsettled.pop(delivery_id)
            reply = self.conn.on_outcome(token, entity, state)
            if not settled:
                self.send(pf.DispositionFrame(role=False, first=delivery_id, last=None,
                                              settled=True, state=reply, batchable=None))

    def on_detach(self, f: list[Any]) -> None:
        link = self.links.pop(f[0], None)
        if link is None:
            return
        self.conn.unregister(link)
        self.send(pf.DetachFrame(handle=link.handle, closed=bool(f[1]), error=None))

    def response_link(self, request_link: Link) -> Optional[Link]:
        for link in self.links.values():
            if link.broker_sends and link.kind == request_link.kind and \
                    link.address == request_link.address:
                return link
        return None


class Connection:
    """Protocol state of one client socket."""

    def __init__(self, store: Store, peer: str) -> None:
        self.store = store
        self.peer = peer
        self.reader = _amqp.FrameReader()
        self.outbuf = bytearray()
        self.sessions: dict[int, Session] = {}
        self.remote_max_frame = 512
        self.closing = False  # close the socket once outbuf is written
        self.closed = False

    def send(
        self, channel: int, performative: Any, frame_type: int = _amqp.FRAME_TYPE_AMQP
    ) -> None:
        self.outbuf += _amqp.encode_frame(channel, performative, frame_type)

    def links(self) -> list[Link]:
        return [link for s in self.sessions.values() for link in s.links.values()]

    def teardown(self) -> None:
        """Forget all sessions (the socket is gone or closing); locks survive until expiry."""
        for session in self.sessions.values():
            for link in session.links.values():
                self.unregister(link)
        self.sessions.clear()
        self.closed = True

    def unregister(self, link: Link) -> None:
        if link.entity is not None and link in link.entity.links:
            link.entity.links.remove(link)

    def feed(self, data: bytes) -> None:
        self.reader.feed(data)
        for item in self.reader.items():
            if isinstance(item, bytes):
                self._on_header(item)
            else:
                self._on_frame(item)
            if self.closing:
                return

    def _on_header(self, header: bytes) -> None:
        if header == _amqp.SASL_HEADER:
            self.outbuf += _amqp.SASL_HEADER
            self.send(0, pf.SASLMechanism(
                sasl_server_mechanisms=[b"MSSBCBS", b"ANONYMOUS", b"PLAIN", b"EXTERNAL"]),
                _amqp.FRAME_TYPE_SASL)
        elif header == _amqp.AMQP_HEADER:
            self.outbuf += _amqp.AMQP_HEADER
        else:
            self.outbuf += _amqp.AMQP_HEADER
            self.closing = True

    def _on_frame(self, frame: _amqp.Frame) -> None:
        code, f, channel = frame.code, frame.fields, frame.channel
        if code == _amqp.SASL_INIT:
            self.send(0, pf.SASLOutcome(code=0, additional_data=None), _amqp.FRAME_TYPE_SASL)
            self.reader.expect_header = True
        elif code == _amqp.OPEN:
            self.remote_max_frame = max(512, min(f[2] or MAX_FRAME_SIZE, 2**31))
            self.send(0, pf.OpenFrame(
                container_id="jobq-servicebus-test-broker", hostname=None,
                max_frame_size=MAX_FRAME_SIZE, channel_max=f[3] if f[3] is not None else 65535,
                idle_timeout=None, outgoing_locales=None, incoming_locales=None,
                offered_capabilities=None, desired_capabilities=None, properties=None,
            ))
        elif code == _amqp.BEGIN:
            self.sessions[channel] = Session(self, channel, f[1] or 0)
            self.send(channel, pf.BeginFrame(
                remote_channel=channel, next_outgoing_id=0, incoming_window=SESSION_WINDOW,
                outgoing_window=SESSION_WINDOW, handle_max=HANDLE_MAX, offered_capabilities=None,
                desired_capabilities=None, properties=None,
            ))
        elif code == _amqp.END:
            session = self.sessions.pop(channel, None)
            if session is not None:
                for link in session.links.values():
                    self.unregister(link)
            self.send(channel, pf.EndFrame(error=None))
        elif code == _amqp.CLOSE:
            self.teardown()
            self.send(0, pf.CloseFrame(error=None))
            self.closing = True
        elif code in (_amqp.ATTACH, _amqp.FLOW, _amqp.TRANSFER, _amqp.DISPOSITION, _amqp.DETACH):
            session = self.sessions.get(channel)
            if session is None:  # e.g. the SDK detaches links after ending their session
                _LOGGER.debug("test broker: frame 0x%02x on ended channel %d", code, channel)
                return
            handler = {
                _amqp.ATTACH: session.on_attach,
                _amqp.FLOW: session.on_flow,
                _amqp.TRANSFER: session.on_transfer,
                _amqp.DISPOSITION: session.on_disposition,
                _amqp.DETACH: session.on_detach,
            }[code]
            handler(f)
        else:
            _LOGGER.debug("test broker: ignoring frame 0x%02x", code)

    # -- application level ----------------------------------------------------------------

    def on_message(self, link: Link, payload: bytes, message_format: int) -> Any:
        """A complete message arrived on a client sender link; returns the delivery state."""
        if link.kind == "queue":
            assert link.entity is not None
            if message_format == _amqp.BATCH_MESSAGE_FORMAT:
                for inner in _amqp.split_batch(payload):
                    self.store.enqueue(link.entity, inner)
            else:
                self.store.enqueue(link.entity, payload)
            return Accepted()
        response = _mgmt.handle_request(self.store, link.kind, link.entity,
                                        _amqp.decode_message(payload))
        reply_link = link.session.response_link(link)
        if reply_link is not None:
            reply_link.responses.append(response)
        return Accepted()

    def on_outcome(self, token: uuid.UUID, entity: Entity, state: dict[str, Any]) -> Any:
        """Apply a client's disposition outcome to a locked message; returns the echo state."""
        echo: Any
        if "accepted" in state:
            ok, echo = self.store.settle(token, "complete", entity=entity), Accepted()
        elif "rejected" in state:
            error = (state["rejected"] or [None])[0] or [None, None, None]
            info = error[2] if len(error) > 2 and isinstance(error[2], dict) else {}
            ok = self.store.settle(
                token, "deadletter",
                reason=_amqp.text(info.get(b"DeadLetterReason")),
                description=_amqp.text(info.get(b"DeadLetterErrorDescription")),
                entity=entity,
            )
            echo = Rejected(error=None)
        elif "released" in state:
            ok, echo = self.store.settle(token, "release", entity=entity), Released()
        elif "modified" in state:
            values = list(state["modified"] or []) + [None, None]
            ok = self.store.settle(token, "abandon", delivery_failed=bool(values[0]),
                                   entity=entity)
            echo = Modified(delivery_failed=values[0], undeliverable_here=values[1],
                            message_annotations=None)
        else:
            return None
        if ok:
            return echo
        return Rejected(error=AMQPError(
            condition=_mgmt.LOCK_LOST.encode(),
            description="The lock supplied is invalid. Either the lock expired, or the message "
            "has already been removed from the queue.",
        ))

    def deliver(self, link: Link, entity: Entity, message: Any) -> None:
        session = link.session
        if link.settled_deliveries:  # receive-and-delete
            self.store.remove(entity, message)
            session.transfer(link, uuid.uuid4().bytes_le, message.payload(), True)
            self.store.record("deliver", entity, message, None, mode="receive_and_delete")
            return
        record = self.store.lock(entity, message)
        payload = message.payload(record.token, record.locked_until_ms)
        delivery_id = session.transfer(link, record.token.bytes_le, payload, False)
        session.unsettled[delivery_id] = (record.token, entity)
        self.store.record("deliver", entity, message, record.token,
                          locked_until=record.locked_until_ms / 1000.0,
                          link=link.name.decode(errors="replace"))


def pump(links: Iterable[Link]) -> bool:
    """One round of sending what link credit allows: queued messages, management responses.

    Each queue link gets at most one message per round, least recently served first, so
    receivers sharing a queue take turns. Returns True if a message was delivered (the caller
    repeats rounds until nothing moves).
    """
    progress = False
    for link in sorted(links, key=lambda lk: lk.last_served):
        if not link.broker_sends or link.session.conn.closed:
            continue
        session = link.session
        if link.kind == "queue":
            entity = link.entity
            assert entity is not None
            if link.credit > 0:
                message = entity.next_available()
                if message is not None:
                    session.conn.deliver(link, entity, message)
                    progress = True
        else:
            while link.credit > 0 and link.responses:
                session.transfer(link, uuid.uuid4().bytes, link.responses.popleft(), True)
        if link.drain and not (link.kind == "queue" and link.credit > 0
                               and link.entity is not None and link.entity.next_available()):
            link.delivery_count += max(link.credit, 0)
            link.credit = 0
            link.drain = False
            session.flow(link, drain=True)
    return progress
