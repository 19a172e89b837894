"""A small in-process AMQP 1.0 broker that the real ``azure-servicebus`` SDK can talk to.

It speaks just enough of the Service Bus dialect for queue tests: SASL (any mechanism is
accepted), ``$cbs`` put-token (always accepted), sender links (store messages, batches
included), peek-lock and receive-and-delete receiver links with exact credit handling,
settlement through dispositions (complete / abandon / dead-letter / release), lock expiry,
max delivery count, dead-letter sub-queues, and the ``$management`` operations
``renew-lock``, ``peek-message`` and ``update-disposition``.

Threads:

* The *broker thread* (started by :meth:`ServiceBusTestBroker.start`) owns the sockets. It
  accepts connections, reads and parses frames, runs the protocol, expires locks and writes
  replies. It holds the broker lock while touching any state.
* The *test thread* calls the public hooks below. They take the same lock, and wake the
  broker thread (through a socket pair) when they change something it must act on.

Connect with :attr:`ServiceBusTestBroker.connection_string`; ``UseDevelopmentEmulator=true``
makes the SDK use plain TCP to the given port.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
import uuid
from typing import Callable, Optional, Union

from . import _amqp
from ._protocol import Connection, pump
from ._store import Entity, Event, MessageInfo, Store

_LOGGER = logging.getLogger(__name__)

TICK_SECONDS = 0.02  # how often locks are checked for expiry
DEAD_LETTER = "deadletter"

__all__ = ["DEAD_LETTER", "Event", "MessageInfo", "ServiceBusTestBroker"]


class _Client:
    """A connected socket and its protocol state (owned by the broker thread)."""

    def __init__(self, sock: socket.socket, conn: Connection) -> None:
        self.sock = sock
        self.conn = conn


class ServiceBusTestBroker:
    """In-process Service Bus look-alike on 127.0.0.1. See the module docstring for threads."""

    def __init__(self, *, lock_duration: float = 60.0, max_delivery_count: int = 10,
                 auto_create_queues: bool = True, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self._store = Store(lock_duration, max_delivery_count, auto_create_queues)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._frozen = False
        self._clients: list[_Client] = []
        self._listener: Optional[socket.socket] = None
        self._wake_r: Optional[socket.socket] = None
        self._wake_w: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None
        #: Exceptions raised inside the broker thread (protocol or internal errors); the
        #: ``sb_broker`` fixture fails the test if this is not empty at teardown.
        self.errors: list[Exception] = []

    # -- lifecycle (test thread) ----------------------------------------------------------

    @property
    def connection_string(self) -> str:
        return (f"Endpoint=sb://{self.host}:{self.port};SharedAccessKeyName=test;"
                "SharedAccessKey=dGVzdA==;UseDevelopmentEmulator=true")

    def start(self) -> ServiceBusTestBroker:
        """Bind a free port and start the broker thread."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._thread = threading.Thread(target=self._run, name=f"sb-test-broker-{self.port}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker thread and close every socket. Idempotent."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("test broker thread did not stop")
            self._thread = None
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._listener = self._wake_r = self._wake_w = None

    def __enter__(self) -> ServiceBusTestBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- broker thread ----------------------------------------------------------------------

    def _wake(self) -> None:
        wake = self._wake_w
        if wake is not None:
            try:
                wake.send(b"x")
            except OSError:
                pass  # buffer full (already woken) or closing

    def _run(self) -> None:
        """Broker thread main loop: select, read, run the protocol, expire locks, write."""
        assert self._listener is not None and self._wake_r is not None
        try:
            while not self._stop.is_set():
                with self._lock:
                    frozen = self._frozen
                    clients = list(self._clients)
                readable = [self._wake_r]
                writable = []
                if not frozen:
                    readable.append(self._listener)
                    readable += [c.sock for c in clients]
                    writable = [c.sock for c in clients if c.conn.outbuf]
                ready_r, ready_w, _ = select.select(readable, writable, [], TICK_SECONDS)
                with self._lock:
                    try:
                        self._step(ready_r, ready_w, clients)
                    except Exception as exc:  # keep serving; the fixture reports it
                        _LOGGER.exception("test broker: internal error")
                        self.errors.append(exc)
                    self._changed.notify_all()
        finally:
            with self._lock:
                for client in list(self._clients):
                    self._drop(client)

    def _step(self, ready_r: list, ready_w: list, clients: list[_Client]) -> None:
        """One loop iteration (broker lock held): I/O, lock expiry, deliveries, writes."""
        self._drain_wake()
        if not self._frozen:
            self._io(ready_r, ready_w, clients)
        self._store.expire_due()
        if not self._frozen:
            links = [lk for c in self._clients for lk in c.conn.links()]
            while pump(links):
                pass
            for client in list(self._clients):
                self._write(client)

    def _drain_wake(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _io(self, ready_r: list, ready_w: list, clients: list[_Client]) -> None:
        if self._listener in ready_r:
            self._accept()
        for client in clients:
            if client.sock in ready_r and client in self._clients:
                self._read(client)
            if client.sock in ready_w and client in self._clients:
                self._write(client)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._clients.append(_Client(sock, Connection(self._store, f"{addr[0]}:{addr[1]}")))

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(256 * 1024)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        try:
            client.conn.feed(data)
        except Exception as exc:  # drop the connection, keep serving the others
            _LOGGER.exception("test broker: protocol error from %s", client.conn.peer)
            self.errors.append(exc)
            self._drop(client)

    def _write(self, client: _Client) -> None:
        conn = client.conn
        while conn.outbuf:
            try:
                sent = client.sock.send(conn.outbuf)
            except BlockingIOError:
                return
            except OSError:
                self._drop(client)
                return
            del conn.outbuf[:sent]
        if conn.closing:
            self._drop(client)

    def _drop(self, client: _Client) -> None:
        client.conn.teardown()
        if client in self._clients:
            self._clients.remove(client)
        client.sock.close()

    # -- configuration and inspection hooks (test thread) ---------------------------------

    def create_queue(self, name: str, *, lock_duration: Optional[float] = None,
                     max_delivery_count: Optional[int] = None,
                     duplicate_window: Optional[float] = None) -> None:
        """Create (or reconfigure) a queue. Lock duration in seconds (float allowed);
        ``duplicate_window`` > 0 turns duplicate detection on (by message id)."""
        with self._lock:
            queue = self._store.queue(name)
            assert queue is not None
            if duplicate_window is not None:
                queue.duplicate_window = float(duplicate_window)
            if lock_duration is not None:
                queue.lock_duration = float(lock_duration)
            if max_delivery_count is not None:
                queue.max_delivery_count = int(max_delivery_count)

    def _entity(self, queue: str, sub_queue: Optional[str] = None) -> Entity:
        q = self._store.queue(queue, create=self._store.auto_create)
        if q is None:
            raise KeyError(f"no queue {queue!r} (create it with create_queue)")
        return q.dlq if sub_queue == DEAD_LETTER else q.main

    def send(self, queue: str, body: Union[bytes, str], *, message_id: Optional[str] = None,
             application_properties: Optional[dict[str, object]] = None) -> int:
        """Enqueue a data-body message directly; returns its sequence number."""
        if isinstance(body, str):
            body = body.encode()
        payload = _amqp.build_message_payload(body, message_id, application_properties)
        with self._lock:
            message = self._store.enqueue(self._entity(queue), payload)
        self._wake()
        return message.seq

    def messages(self, queue: str, sub_queue: Optional[str] = None) -> list[MessageInfo]:
        """Snapshots of the messages (locked ones included) in a queue or its DLQ."""
        with self._lock:
            entity = self._entity(queue, sub_queue)
            return [m.info() for m in sorted(entity.messages.values(), key=lambda m: m.seq)]

    def active_count(self, queue: str) -> int:
        """Messages in the queue proper (available or locked), like Service Bus' count."""
        with self._lock:
            return len(self._entity(queue).messages)

    def available_count(self, queue: str) -> int:
        with self._lock:
            return sum(1 for m in self._entity(queue).messages.values() if m.lock is None)

    def locked_count(self, queue: str) -> int:
        with self._lock:
            return sum(1 for m in self._entity(queue).messages.values() if m.lock is not None)

    def dead_letter_count(self, queue: str) -> int:
        with self._lock:
            return len(self._entity(queue, DEAD_LETTER).messages)

    def delivery_counts(self, queue: str, sub_queue: Optional[str] = None) -> list[int]:
        """Delivery counts of the stored messages, in sequence order."""
        return [m.delivery_count for m in self.messages(queue, sub_queue)]

    def purge(self, queue: str) -> None:
        """Drop every message (and lock) of a queue and its DLQ."""
        with self._lock:
            for entity in (self._entity(queue), self._entity(queue, DEAD_LETTER)):
                for message in list(entity.messages.values()):
                    self._store.remove(entity, message)

    def expire_locks(self, queue: Optional[str] = None) -> int:
        """Expire held locks now (all queues, or one queue); returns how many."""
        with self._lock:
            records = [r for r in list(self._store.locks.values())
                       if queue is None or r.entity.queue.name == queue.lower()]
            for record in records:
                self._store.expire(record)
        self._wake()
        return len(records)

    def fail_renewals(self, enabled: bool = True,
                      lock_token: Optional[Union[uuid.UUID, str]] = None) -> None:
        """Make renew-lock answer lock-lost: for every lock, or for one lock token.

        Only the answer is affected: the broker keeps the lock until it expires or is settled.
        """
        with self._lock:
            if lock_token is None:
                self._store.fail_all_renewals = enabled
                if not enabled:
                    self._store.fail_renewal_tokens.clear()
                return
            token = lock_token if isinstance(lock_token, uuid.UUID) else uuid.UUID(str(lock_token))
            if enabled:
                self._store.fail_renewal_tokens.add(token)
            else:
                self._store.fail_renewal_tokens.discard(token)

    def freeze(self) -> None:
        """Black-hole the network: stop accepting, reading and writing (clients hang).

        Locks still expire while frozen; nothing is delivered until :meth:`unfreeze`.
        """
        with self._lock:
            self._frozen = True
        self._wake()

    def unfreeze(self) -> None:
        with self._lock:
            self._frozen = False
        self._wake()

    @property
    def frozen(self) -> bool:
        with self._lock:
            return self._frozen

    def connection_count(self) -> int:
        with self._lock:
            return len(self._clients)

    def events(self, kind: Optional[str] = None, queue: Optional[str] = None) -> list[Event]:
        """The event log (oldest first), optionally filtered by kind and entity path."""
        with self._lock:
            return [e for e in self._store.events
                    if (kind is None or e.kind == kind) and (queue is None or e.queue == queue)]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0,
                 message: str = "condition") -> None:
        """Block until ``predicate()`` (evaluated under the broker lock) is true.

        Raises ``TimeoutError`` after ``timeout`` seconds (``time.monotonic`` deadline).
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
                self._changed.wait(min(remaining, 0.1))
