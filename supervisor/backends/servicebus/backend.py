"""Azure Service Bus backend (azure-servicebus 7.15, PeekLock, prefetch 0), behind the
Backend/Lease seam.

Wire format: the ai4s-jobq v1 envelope as a UTF-8 data body; ``push`` uses the task id as
message id (so the queue's duplicate detection drops a producer's retried push).  Failed
tasks go to the queue's dead-letter sub-queue with the reason and a description holding
exit status, attempts, worker and the output's end.  Attempts: the wire's delivery count
(0 on the first delivery) + 1 + ``jobq_prior_attempts`` (set when a preempted task is sent
again, see backends/servicebus/lease.py).

Threads: the messages of one receive call come on one receiver, which their leases then share
(each SDK call on it under its lock; see backends/servicebus/pool.py); the receivers are opened by
one
opener thread.  The main thread
has its own client for push/peek/ctl commands.

Lock length (docs/architecture.rst, the lease deadline): the queue's LockDuration, read once
with the administration client where the credential allows it, else ``--lock-duration``; the
broker's locked-until minus the local clock is only a cross-check (the shorter wins when it is
plausible).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING, Callable, TypeVar

from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)

from ...core.task import Task, parse_or_body
from ..azure_common import AzureBackendState, matches, reset_for_requeue
from ..base import Backend, BackendBase, BackendConfigError, FailedRecord, Lease, QueueStatus
from ..common import held_until, mapped_errors
from .errors import SDK_ERRORS, LockCheck, failed_record, message_text, translate
from .lease import ServiceBusLease
from .pool import ReceiverPool

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.servicebus.management import ServiceBusAdministrationClient

__all__ = ["ServiceBusBackend", "ServiceBusLease"]
LOG = logging.getLogger("supervisor.backends.servicebus")  # pinned (layout move)
T = TypeVar("T")

CALL_TIMEOUT = 10.0  # s: one SDK call of the main thread or an opener (no SDK retries)
OPEN_WAIT = 15.0  # s: the worker's backend waits this long for its first connection
KEEPERS_PER_RECEIVER = 8  # slots per receiver kept open (see __init__)
PEEK_PAGE = 250
COUNT_LIMIT = 10000  # peek-count fallback of size(): stop here
ADMIN_RETRY = 600.0  # s: after the administration API failed, count by peeking this long
LIST_BUDGET = 30.0  # s: requeue holds dead-lettered messages at most this long
# s a receive waits for a first message while leases of this worker are not over (and in a
# batch run, backends/__init__.py): the main thread blocks for the whole wait on an empty
# queue, and tasks starting, exiting and settling then wait for it (the first empty receive
# of a drain held its last tasks ~1 s).
# Enough for a message the broker has to come back on a slow link (tens of ms); less would
# not return sooner: the SDK checks its deadline between socket reads of up to 0.2 s each.
SHORT_RECEIVE_WAIT = 0.2
_NAMESPACE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{4,48}[A-Za-z0-9](\.[A-Za-z0-9.-]+)?$")


class ServiceBusBackend(AzureBackendState, BackendBase):
    """One Service Bus queue and its dead-letter sub-queue.  Main thread unless stated."""

    name = "servicebus"
    # A lapsed lock makes the message available again; our estimate of the broker's expiry
    # can be early by a renewal's transit, and an idle receiver may hold it for a moment.
    lost_lease_return_delay = 5.0
    lost_lease_return = "Service Bus delivers the message again when its lock expires"
    no_retry_delay: str | None = "Service Bus applies no retry delay"  # abandon is at once
    unique_tasks = True  # by message id, with the queue's duplicate detection (push)

    def __init__(self, queue: str, *, connection_string: str | None = None,
                 namespace: str | None = None, credential: TokenCredential | None = None,
                 worker_id: str = "",
                 lock_duration: float = 60.0, receivers: int = 0,
                 receive_wait: float = 1.0) -> None:
        """``receivers`` > 0 (the worker): read the queue's LockDuration, then open that many
        receivers in the background and wait for the first one, so that ``receive`` never
        waits for a connection to open (up to OPEN_WAIT s here; BackendError if none)."""
        if bool(connection_string) == bool(namespace):
            raise BackendConfigError(
                "servicebus needs exactly one of a connection string or a namespace")
        self._init_azure(queue, worker_id, connection_string, None, translate)
        self._namespace = namespace
        self.receive_wait = receive_wait
        self._credential = credential
        if namespace:
            if not _NAMESPACE.match(namespace):
                raise BackendConfigError(f"--namespace: {namespace!r} is not a Service Bus "
                                         "namespace (NAME.servicebus.windows.net)")
            if "." not in namespace:
                self._namespace = namespace + ".servicebus.windows.net"
            if credential is None:
                from azure.identity import DefaultAzureCredential

                # Shared by every client and thread: azure-identity credentials are meant to be.
                self._credential = DefaultAzureCredential()
        self.emulator = "usedevelopmentemulator=true" in (connection_string or "").lower()
        # Monotonic time until which size() does not try the administration API again: the
        # queue sampler counts every 15 s, and without Manage rights every try fails (and
        # used to log a line each time).
        self._no_admin_until = 0.0
        self._main = self.new_client()
        self.pool = ReceiverPool(self._new_pool_receiver, self.scrub)
        # Receivers kept open: a receive takes one whose lock is free (not in a keeper's
        # renewal or settlement), so one more than the main thread needs, and more with many
        # slots, whose keepers call more often.
        self._keep = max(2, -(-receivers // KEEPERS_PER_RECEIVER))
        self._leases: set[ServiceBusLease] = set()  # unsettled; under _leases_lock
        self._leases_lock = threading.Lock()
        self.lock_check = LockCheck(
            (self._queue_lock_duration() if receivers else None) or lock_duration)
        if receivers:
            try:
                self.pool.start(self._keep, OPEN_WAIT)
            except BaseException:
                self.close()
                raise

    def __repr__(self) -> str:
        where = self._namespace or self.scrub(self._connection_string or "").split(";")[0]
        return f"ServiceBusBackend(queue={self.queue_name!r}, endpoint={where!r})"

    def new_client(self) -> ServiceBusClient:
        """Any thread: a new client (no I/O until used), for one thread's use.  No SDK
        retries and bounded attempts: callers retry BackendError themselves."""
        try:
            if self._connection_string:
                return ServiceBusClient.from_connection_string(
                    self._connection_string, retry_total=0, try_timeout=CALL_TIMEOUT)
            # a namespace: with the given credential, or DefaultAzureCredential (__init__)
            assert self._namespace is not None and self._credential is not None
            return ServiceBusClient(self._namespace, self._credential, retry_total=0,
                                    try_timeout=CALL_TIMEOUT)
        except (ValueError, TypeError) as exc:  # malformed connection string
            raise BackendConfigError(
                f"servicebus: bad connection string or namespace: {self.scrub(str(exc))}"
            ) from None

    def _new_pool_receiver(self) -> ServiceBusReceiver:
        """Opener thread: a PeekLock receiver, prefetch 0, on a client of its own."""
        return self.new_client().get_queue_receiver(
            self.queue_name, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0,
            timeout=CALL_TIMEOUT)

    def _queue_lock_duration(self) -> float | None:
        """The queue's LockDuration, where the credential may read it (Manage rights)."""
        if self.emulator:
            LOG.info("lock duration: --lock-duration (no administration API with the emulator)")
            return None
        try:
            with self._admin() as admin:
                props = admin.get_queue(self.queue_name, connection_timeout=5, read_timeout=10)
        except Exception as exc:  # no Manage rights, no network: fall back, say why
            LOG.warning("cannot read the queue's LockDuration (%s); using --lock-duration",
                        self.translate(exc, "get queue"))
            return None
        duration = props.lock_duration
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else None
        if seconds:
            LOG.info("queue %s: LockDuration %gs, MaxDeliveryCount %s", self.queue_name, seconds,
                     props.max_delivery_count)
        return seconds

    def _admin(self) -> ServiceBusAdministrationClient:
        """An administration client (HTTPS; needs Manage rights to be of use), no retries."""
        from azure.servicebus.management import ServiceBusAdministrationClient

        if self._connection_string:
            return ServiceBusAdministrationClient.from_connection_string(
                self._connection_string, retry_total=0)
        assert self._credential is not None  # with a namespace (__init__)
        return ServiceBusAdministrationClient(str(self._namespace), self._credential,
                                              retry_total=0)

    def _sdk(self, what: str) -> AbstractContextManager[None]:
        """Translate SDK errors of a block (opening a client happens on ``with``)."""
        return mapped_errors(what, SDK_ERRORS, self.translate)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        with self._sdk(what):
            return fn()

    def receive(self, max_messages: int, lock_duration: float) -> list[Lease]:
        """Up to ``max_messages`` in one call, on a receiver that their leases then share
        with every other call on it (backends/servicebus/pool.py); waits ``receive_wait`` s for the
        first message, ``SHORT_RECEIVE_WAIT`` at most while any lease is not over.

        Prefetch stays 0: the call gives the broker credit for exactly ``max_messages`` (the
        free slots), so every lock it takes belongs to a lease that starts now, renewed or
        settled by its keeper like any other."""
        if max_messages < 1:
            return []
        shared = self.pool.take(self._keep, self.receive_wait)
        with self._leases_lock:
            busy = bool(self._leases)
        wait = min(self.receive_wait, SHORT_RECEIVE_WAIT) if busy else self.receive_wait
        leases: list[Lease] = []
        try:
            t_sent = time.monotonic()
            got = shared.receiver.receive_messages(max_message_count=max_messages,
                                                   max_wait_time=wait)
            # Fewer than asked: the rest of the credit is out, and what it brings in is
            # released by the receiver's close, which the exit then waits for.  Sticky: a
            # later receive served from what that credit brought in sends no new credit.
            shared.credit_left = shared.credit_left or len(got) < max_messages
            if got:
                LOG.debug("received %d message(s) in one call (asked for %d)", len(got),
                          max_messages)
            for message in got:
                until = message.locked_until_utc
                granted = self.lock_check.granted(until.timestamp() - time.time()) if until \
                    else self.lock_check.configured
                lease = ServiceBusLease(self, shared, message, granted, t_sent)
                with self._leases_lock:
                    self._leases.add(lease)
                leases.append(lease)
        except SDK_ERRORS as exc:
            shared.retire()  # closed on the opener thread once no lease holds it
            raise self.translate(exc, "receive") from None
        finally:
            shared.lock.release()
            self.pool.give_back(shared, front=True)
        return leases

    def forget(self, lease: ServiceBusLease) -> None:
        """Any thread: the lease is over."""
        with self._leases_lock:
            self._leases.discard(lease)

    def _unsettled(self) -> list[ServiceBusLease]:
        with self._leases_lock:
            return list(self._leases)

    def maintenance(self) -> None:
        """Close the receivers of leases lost without a settlement (their keeper stopped
        calling them once the deadline passed)."""
        now = time.monotonic()
        for lease in self._unsettled():
            if not lease.busy and not lease.done and now > lease.expires + 5.0:
                lease.lost()

    def send(self, messages: list[ServiceBusMessage], what: str,
             timeout: float = CALL_TIMEOUT) -> None:
        """Any thread: send on a sender of its own."""
        with self._sdk(what), self.new_client() as client, \
                client.get_queue_sender(self.queue_name) as sender:
            sender.send_messages(messages, timeout=timeout)

    def push(self, tasks: Sequence[Task]) -> list[str]:
        """Send the tasks in batches; returns their ids.  The message id is the task's
        unique key, else its id (duplicate detection drops a repeat, see docs/backends.rst); a
        delayed task is a scheduled message."""
        ids: list[str] = []
        if any(t.unique_key for t in tasks):
            LOG.warning("unique keys are message ids: with duplicate detection on the queue "
                        "(docs/backends.rst, \"Azure Service Bus\") Service Bus drops a repeat "
                        "within its window, without telling; an id printed for it names a task "
                        "that never runs")
        with self._sdk("push"), self._main.get_queue_sender(self.queue_name) as sender:
            batch = self._call("push", sender.create_message_batch)
            for task in tasks:
                message = ServiceBusMessage(
                    task.to_json(), message_id=task.unique_key or task.id,
                    content_type="application/json",
                    scheduled_enqueue_time_utc=None if task.not_before is None
                    else datetime.fromtimestamp(task.not_before, timezone.utc))
                try:
                    batch.add_message(message)
                except ValueError:  # MessageSizeExceededError: the batch is full
                    self._call("push", partial(sender.send_messages, batch))
                    batch = self._call("push", sender.create_message_batch)
                    batch.add_message(message)
                ids.append(task.id)
            if len(batch):
                self._call("push", lambda: sender.send_messages(batch))
        return ids

    def _peek_all(self, sub_queue: ServiceBusSubQueue | None,
                  limit: int) -> list[ServiceBusReceivedMessage]:
        out: list[ServiceBusReceivedMessage] = []
        with self._sdk("peek"), self._main.get_queue_receiver(self.queue_name, sub_queue=sub_queue,
                                           prefetch_count=0) as receiver:
            seq = 0
            while len(out) < limit:
                count = min(PEEK_PAGE, limit - len(out))
                page = self._call("peek", partial(
                    receiver.peek_messages, max_message_count=count, sequence_number=seq))
                if not page:
                    break
                out += page
                seq = (page[-1].sequence_number or 0) + 1
        return out

    def _count(self, dead_letter: bool) -> int:
        """Any thread that owns this backend (jobq-ctl, the queue sampler)."""
        if not self.emulator and time.monotonic() >= self._no_admin_until:
            try:
                with self._admin() as admin:
                    props = admin.get_queue_runtime_properties(
                        self.queue_name, connection_timeout=5, read_timeout=10)
                return int((props.dead_letter_message_count if dead_letter
                            else props.active_message_count) or 0)
            except Exception as exc:  # no Manage rights: count by peeking
                if not self._no_admin_until:  # the first time only
                    LOG.info("administration API not available (%s); counting by peeking "
                             "(tried again every %.0f s)", self.translate(exc, "queue "
                                                                             "properties"),
                             ADMIN_RETRY)
                self._no_admin_until = time.monotonic() + ADMIN_RETRY
        sub = ServiceBusSubQueue.DEAD_LETTER if dead_letter else None
        n = len(self._peek_all(sub, COUNT_LIMIT))
        if n >= COUNT_LIMIT:
            LOG.warning("counted %d messages by peeking and stopped; there are more", n)
        return n

    def size(self) -> int:
        """Active messages (locked ones included), like the portal's count."""
        return self._count(dead_letter=False)

    def peek(self, n: int) -> list[Task | str]:
        """Scheduled messages with their scheduled time (``held_until``), not their body's:
        a requeued copy is sent unscheduled."""
        out: list[Task | str] = []
        now = time.time()
        for message in self._peek_all(None, max(0, n)):
            at = getattr(message, "scheduled_enqueue_time_utc", None)
            out.append(held_until(parse_or_body(message_text(message)),
                                  at.timestamp() if at is not None else None, now))
        return out

    def status(self) -> QueueStatus:
        return QueueStatus(counts={"pending": self.size(), "failed": self._count(True)})

    def failed(self) -> list[FailedRecord]:
        return [failed_record(m) for m in self._peek_all(ServiceBusSubQueue.DEAD_LETTER,
                                                         COUNT_LIMIT)]

    def requeue(self, ids: Sequence[str] | None) -> int:
        """Move dead-lettered tasks (by task or message id; None = all) back to the queue:
        send a copy (new message id, preemptions reset), then complete the dead letter."""
        moved, held = 0, []
        deadline = time.monotonic() + LIST_BUDGET
        with self._sdk("requeue"), self._main.get_queue_receiver(
                self.queue_name, sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0) as dlq, \
                self._main.get_queue_sender(self.queue_name) as sender:
            try:
                while time.monotonic() < deadline:
                    batch = self._call("list failed", lambda: dlq.receive_messages(
                        max_message_count=50, max_wait_time=1.0))
                    if not batch:
                        break
                    for message in batch:
                        record = failed_record(message)
                        if not matches(record, str(message.message_id), ids):
                            held.append(message)  # kept locked so it is not received again
                            continue
                        copy = ServiceBusMessage(
                            reset_for_requeue(record.body), content_type="application/json",
                            message_id=f"r-{message.lock_token or uuid.uuid4()}")
                        # Send first, then complete: a failure in between duplicates.
                        what = f"requeue {record.id}"
                        self._call(what, partial(sender.send_messages, copy))
                        self._call(what, partial(dlq.complete_message, message))
                        moved += 1
            finally:
                for message in held:
                    try:
                        dlq.abandon_message(message)
                    except SDK_ERRORS as exc:  # comes back when its lock expires anyway
                        LOG.warning("%s", self.translate(exc, "release failed record"))
        return moved

    def clear(self, failed: bool) -> int:
        """Delete the available messages (not those locked by workers right now)."""
        count = 0
        sub = ServiceBusSubQueue.DEAD_LETTER if failed else None
        with self._sdk("clear"), self._main.get_queue_receiver(
                self.queue_name, sub_queue=sub, prefetch_count=0,
                receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            while True:
                got = self._call("clear", lambda: receiver.receive_messages(
                    max_message_count=100, max_wait_time=1.0))
                if not got:
                    return count
                count += len(got)

    def close(self) -> None:
        for lease in self._unsettled():
            if not lease.busy:
                lease.lost()
        if getattr(self, "pool", None) is not None:
            self.pool.close()
        if getattr(self, "_main", None) is not None:
            self._main.close()


if TYPE_CHECKING:  # mypy: both classes satisfy the protocols of base.py

    def _conforms(backend: ServiceBusBackend, lease: ServiceBusLease) -> tuple[Backend, Lease]:
        return backend, lease
