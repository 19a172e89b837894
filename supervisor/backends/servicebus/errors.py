"""Helpers of the Service Bus backend: error mapping, lock-length cross-check, message text,
dead-letter descriptions.  Nothing here talks to the network.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from azure.core.exceptions import AzureError, ClientAuthenticationError
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    MessageNotFoundError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    SessionLockLostError,
)

from ..azure_common import Scrubber, detail
from ..base import BackendConfigError, BackendError, FailedRecord, LeaseLost, QueueNotFound
from ..common import parse_body

__all__ = ["SDK_ERRORS", "translate"]
LOG = logging.getLogger("supervisor.backends.servicebus_util")  # pinned (layout move)

# What an SDK call may raise: its own errors (AzureError), MessageAlreadySettled and "handler
# shut down" (ValueError), socket errors it did not wrap, and plain timeouts.
SDK_ERRORS = (AzureError, ValueError, OSError, TimeoutError)
PRIOR_ATTEMPTS = "jobq_prior_attempts"  # application property of re-sent (preempted) messages
MAX_DEAD_LETTER_TEXT = 4096  # Service Bus limit for DeadLetterReason / ...ErrorDescription
SKEW_WARN = 2.0  # s: cross-check and configured lock may differ this much without a warning
_MIN_PLAUSIBLE = 1.0  # s: a cross-check below this is a skewed clock, not a real lock
_LEASE_GONE = (MessageLockLostError, MessageNotFoundError, MessageAlreadySettled,
               SessionLockLostError)
_TRANSIENT = (ServiceBusConnectionError, OperationTimeoutError, TimeoutError, OSError)


def translate(exc: BaseException, what: str, scrub: Scrubber, lease: bool = False) -> Exception:
    """Map an SDK exception onto LeaseLost / BackendError / BackendConfigError.

    ``lease``: the call was about one received message, so lock lost / already settled /
    not found mean the lease is gone.  Only a scrubbed one-line summary is kept; callers
    raise the result ``from None`` so the SDK's exception is not chained into logs.
    """
    summary = detail(exc, str(exc).splitlines()[0] if str(exc) else "", scrub)
    if lease and isinstance(exc, _LEASE_GONE):
        return LeaseLost(f"{what}: lock lost or message already settled ({summary})")
    if isinstance(exc, (ServiceBusAuthenticationError, ServiceBusAuthorizationError,
                        ClientAuthenticationError)):
        return BackendConfigError(f"{what}: not authorized: {summary}")
    if isinstance(exc, MessagingEntityNotFoundError):
        return QueueNotFound(f"{what}: the queue does not exist in this namespace: {summary}")
    if isinstance(exc, _TRANSIENT):
        return BackendError(f"{what}: network error or timeout: {summary}")
    return BackendError(f"{what}: failed: {summary}")


class LockCheck:
    """The lock length to trust: the configured one (queue LockDuration or --lock-duration),
    cross-checked against the broker's locked-until minus the local clock.  Any thread."""

    def __init__(self, configured: float) -> None:
        self.configured = configured
        self._warned = False
        self._lock = threading.Lock()

    def granted(self, seen: float) -> float:
        """``seen`` = locked_until_utc minus local UTC when the call was sent (or returned)."""
        if seen >= self.configured - SKEW_WARN:
            return self.configured
        shorter = seen >= _MIN_PLAUSIBLE
        with self._lock:
            first, self._warned = not self._warned, True
        if first and shorter:
            LOG.warning("the lock ends %.1fs after this machine's now, the configured lock is "
                        "%.1fs: using the shorter (queue LockDuration shorter than "
                        "--lock-duration, or this machine's clock is ahead)", seen,
                        self.configured)
        elif first:
            LOG.error("the lock ends %.1fs after this machine's now although the broker just "
                      "granted it: the clock is skewed; using the configured %.1fs (fix NTP)",
                      seen, self.configured)
        return seen if shorter else self.configured


def message_text(message: ServiceBusReceivedMessage) -> str:
    """The body as text: data sections joined (UTF-8, bad bytes replaced), else str(value)."""
    try:
        body: Any = message.body
        if isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        elif isinstance(body, str):
            return body
        elif str(getattr(message.body_type, "value", message.body_type)) == "data":
            data = b"".join(bytes(part) for part in body)
        else:
            return str(body)
    except (TypeError, ValueError) as exc:  # a body the SDK cannot hand out
        return f"<undecodable body: {type(exc).__name__}>"
    return data.decode("utf-8", "replace")


def prior_attempts(message: ServiceBusReceivedMessage) -> int:
    props = message.application_properties or {}
    value = props.get(PRIOR_ATTEMPTS.encode(), props.get(PRIOR_ATTEMPTS))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def describe(exit_status: int | None, attempts: int, worker: str, failed_at: float,
             output_tail: str) -> str:
    """DeadLetterErrorDescription: a ``key=value`` first line, then the output's end."""
    head = f"exit_status={'-' if exit_status is None else exit_status} attempts={attempts} " \
           f"worker={worker.replace(' ', '_') or '-'} failed_at={failed_at:.3f}\n"
    room = MAX_DEAD_LETTER_TEXT - len(head)
    return head + (output_tail[-room:] if room > 0 and output_tail else "")


_HEAD = re.compile(r"^exit_status=(\S+) attempts=(\d+) worker=(\S+) failed_at=([\d.]+)$")


def failed_record(message: ServiceBusReceivedMessage) -> FailedRecord:
    """A dead-lettered message -> FailedRecord (ours, or dead-lettered by the broker)."""
    body = message_text(message)
    task = parse_body(body)[0]
    reason = message.dead_letter_reason or ""
    description = message.dead_letter_error_description or ""
    head, _, tail = description.partition("\n")
    match = _HEAD.match(head)
    attempts = prior_attempts(message) + (message.delivery_count or 0)
    fallback = str(message.message_id or message.sequence_number)
    record = FailedRecord(id=task.id if task is not None else fallback,
                          attempts=attempts, reason=reason, command=task.cmd if task else "",
                          body=body)
    if match:
        status, count, worker, failed_at = match.groups()
        record.exit_status = int(status) if status.lstrip("-").isdigit() else None
        record.attempts = int(count)
        record.worker = None if worker == "-" else worker
        record.failed_at = float(failed_at)
        record.output_tail = tail
    elif description:
        record.reason = f"{reason}: {description}" if reason else description
    return record
