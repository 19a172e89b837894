"""The lease of the Service Bus backend: one PeekLock message and the receiver it came on.

Made on the main thread by ServiceBusBackend.receive; from then on its LeaseKeeper thread
calls the receiver (renew, settle) -- as do the keepers of the other messages of the same
receive call, and later receives, which share it: every call holds the receiver's lock
(pool.SharedReceiver), so no SDK object is used by two threads at once.  A lost
lease retires the receiver: no receive uses it again, and it is closed once its other leases
are over.  A renewal's ``t_sent`` is taken before the wait for the lock: earlier, so the
deadline it gives is never late.

* renew: ``renew_message_lock`` with the keeper's timeout (the SDK does not retry).  The
  lock granted is the configured length (queue LockDuration or --lock-duration); the new
  locked-until minus the local clock is only a cross-check (errors.LockCheck).
* complete / dead-letter: the SDK's own calls; the dead-letter description holds exit
  status, attempts, worker and the output's end (4096 characters at most).
* retry (release with count_attempt): abandon.  Service Bus cannot delay an abandoned
  message, so the retry delay is not applied here.
* preemption (release without count_attempt): abandon would count a delivery and the 7.x
  SDK cannot modify properties on abandon, so the task is sent again -- body with the
  preemption count + 1, application property ``jobq_prior_attempts`` = attempts used -- and
  the original is completed.  Send first: a failure in between runs the task twice, never
  loses it.  The copy's message id is derived from the lock token, so with duplicate
  detection a retried send is dropped, and the task id (used by push) is not reused.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage, ServiceBusReceiver

from ...core.task import Task, TaskFormatError
from ..azure_common import LeaseHome
from ..base import BackendError
from ..common import mapped_errors, parse_body, settled_error
from .errors import (
    MAX_DEAD_LETTER_TEXT,
    PRIOR_ATTEMPTS,
    SDK_ERRORS,
    LockCheck,
    describe,
    message_text,
    prior_attempts,
)

if TYPE_CHECKING:
    from .pool import SharedReceiver

LOG = logging.getLogger("supervisor.backends.servicebus_lease")  # pinned (layout move)
T = TypeVar("T")
MIN_CALL = 0.5  # s: a settlement call gets at least this long


class Home(LeaseHome, Protocol):
    """What a lease uses of the ServiceBusBackend that received it (which hands itself in:
    no import of it here), beyond what either Azure lease reads.  Any thread."""

    @property
    def lock_check(self) -> LockCheck: ...

    def forget(self, lease: ServiceBusLease) -> None:
        """The lease is over: no longer one of the backend's unsettled leases."""
        ...

    def send(self, messages: list[ServiceBusMessage], what: str, timeout: float) -> None:
        """Send on a sender of its own (errors mapped like the backend's calls)."""
        ...


class ServiceBusLease:
    """One received message.  Made on the main thread; used by its LeaseKeeper thread."""

    def __init__(self, backend: Home, shared: SharedReceiver,
                 message: ServiceBusReceivedMessage, granted: float, t_sent: float) -> None:
        self._backend = backend
        self.queue = backend.queue_name
        self._shared = shared
        shared.hold(self)
        self._message = message
        self.message_id = str(message.message_id or message.sequence_number)
        self.lock_duration = granted
        self.expires = t_sent + granted  # monotonic; the broker's lock ends no earlier
        self.raw_body = message_text(message)
        self.task: Task | None
        self.format_error: str | None
        self.task, self.format_error = parse_body(self.raw_body)
        # The wire's delivery count is 0 on the first delivery; preempted tasks are re-sent
        # (a new message) carrying the attempts used before.
        self.attempt = prior_attempts(message) + (message.delivery_count or 0) + 1
        self.busy = False  # a call is in flight (read by the backend's sweep)
        self.done = False  # settled or lost: the receiver is no longer ours
        self._resent = False

    def __repr__(self) -> str:
        return f"ServiceBusLease(message_id={self.message_id!r}, attempt={self.attempt})"

    def _call(self, what: str, fn: Callable[[ServiceBusReceiver, float], T],
              timeout: float | None = None) -> T:
        """``fn(receiver, seconds left)`` on the shared receiver, errors mapped."""
        what = f"{what} {self.message_id}"
        if self.done:
            raise settled_error(what)
        if timeout is None:  # settlement: bounded by the time left on the lock
            timeout = max(MIN_CALL, (self.expires - time.monotonic()) / 2)
        self.busy = True
        # Unless the lease is lost, the receiver stays ours after an error: the SDK reopens a
        # failed link by itself on the next call.  It is never swapped for another one, as
        # the SDK settles on the current link by delivery id.  The wait for the receiver's
        # lock (another lease of the batch calling) counts against this call's timeout.
        try:
            with mapped_errors(what, SDK_ERRORS, self._backend.translate_lease, on_lost=self.lost):
                return self._shared.call(timeout, lambda r, left: fn(_bound(r, left), left))
        finally:
            self.busy = False

    def lost(self) -> None:
        """The lease is over without a settlement: its receiver is retired, closed once its
        other leases are over too (any thread; once)."""
        self.done = True
        if self._shared.leave(self, lost=True):
            self._backend.forget(self)

    def _settled(self) -> None:
        self.done = True
        if self._shared.leave(self, lost=False):
            self._backend.forget(self)

    def renew(self, timeout: float) -> float:
        """LeaseKeeper thread: extend the lock; seconds granted from when the call was sent."""
        if timeout <= 0:
            raise BackendError(f"renew {self.message_id}: no time left")
        t_sent, wall = time.monotonic(), time.time()
        until = self._call("renew", lambda r, left: r.renew_message_lock(
            self._message, timeout=left), timeout)
        granted = self._backend.lock_check.granted(until.timestamp() - wall)
        self.expires = t_sent + granted
        return granted

    def complete(self) -> None:
        self._call("complete", lambda r, _: r.complete_message(self._message))
        self._settled()

    def release(self, count_attempt: bool, delay: float = 0.0) -> None:
        """Retry: abandon (``delay`` is not applied: Service Bus has no delayed abandon).
        Preemption: send the task again with the attempt given back, complete the original."""
        if count_attempt or self.task is None:
            self._call("abandon", lambda r, _: r.abandon_message(self._message))
            self._settled()
            return
        if not self._resent:
            self._resend(self.task)
        self._call("complete preempted", lambda r, _: r.complete_message(self._message))
        self._settled()

    def _resend(self, task: Task) -> None:
        try:
            body = task.with_preemption().to_json()
        except TaskFormatError:  # one more digit pushed it over the size limit
            body = self.raw_body
        copy = ServiceBusMessage(
            body, message_id=f"p-{self._message.lock_token}", content_type="application/json",
            application_properties={PRIOR_ATTEMPTS: self.attempt - 1})
        timeout = max(MIN_CALL, (self.expires - time.monotonic()) / 2)
        self._backend.send([copy], f"requeue preempted {self.message_id}", timeout)
        self._resent = True

    def dead_letter(self, reason: str, output_tail: str, exit_status: int | None = None) -> None:
        description = describe(exit_status, self.attempt, self._backend.worker_id, time.time(),
                               output_tail)
        self._call("dead-letter", lambda r, _: r.dead_letter_message(
            self._message, reason=reason[:MAX_DEAD_LETTER_TEXT], error_description=description))
        self._settled()


def _bound(receiver: ServiceBusReceiver, seconds: float) -> ServiceBusReceiver:
    """Cap the receiver's next calls at ``seconds`` (under its lock: the receiver is shared):
    a settlement waits for the outcome on the receive link up to ``_config.timeout``, then
    falls back to the management link for up to ``_config.try_timeout`` -- neither can be
    passed per call in azure-servicebus 7.15.  Returns the receiver."""
    config = getattr(receiver, "_config", None)
    if config is not None:
        config.timeout = seconds / 2
        config.try_timeout = seconds / 2
    return receiver
