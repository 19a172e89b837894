"""The lease of the Storage Queue backend: one received message and its pop receipt.

Made on the main thread by StorageQueueBackend.receive; renewed and settled by its own
LeaseKeeper thread, each call on a client it takes from the backend and gives back (see
backends/storage_queue/backend.py on why no client is shared between threads).
"""

from __future__ import annotations

import logging
from typing import Callable, Protocol, TypeVar

from azure.storage.queue import QueueClient, QueueMessage

from ...core.task import Task, TaskFormatError
from ..azure_common import LeaseHome
from ..base import BackendError, LeaseLost
from ..common import mapped_errors, parse_body, settled_error
from .errors import (
    SDK_ERRORS,
    MessageGone,
    clamp_visibility,
    make_record,
    message_text,
)

LOG = logging.getLogger("supervisor.backends.storage_queue_lease")  # pinned (layout move)
T = TypeVar("T")


class Clients(LeaseHome, Protocol):
    """What a lease uses of StorageQueueBackend (which hands itself in: no import of it
    here), beyond what either Azure lease reads.  Any thread."""

    @property
    def failed_queue_name(self) -> str: ...

    @property
    def connect_timeout(self) -> float: ...

    def lease_client(self) -> QueueClient:
        """A client of the queue for one call, given back with ``return_client``."""
        ...

    def return_client(self, client: QueueClient, ok: bool) -> None: ...

    def new_client(self, queue_name: str) -> QueueClient: ...

    def recreate_if_missing(self, exc: BaseException, client: QueueClient) -> bool: ...

    def translate(self, exc: BaseException, what: str) -> Exception:
        """An SDK error as the seam's (errors.translate)."""
        ...


class StorageQueueLease:
    """One received message.  Made on the main thread; renewed and settled by its
    LeaseKeeper thread, which alone uses the lease's clients."""

    def __init__(self, backend: Clients, message: QueueMessage, visibility: int) -> None:
        self._backend = backend
        self.queue = backend.queue_name
        self.message_id: str = message.id
        self._pop_receipt: str | None = message.pop_receipt
        self.dequeue_count: int = message.dequeue_count or 1
        self.lock_duration = float(visibility)
        self.raw_body = message_text(message.content)
        self.task: Task | None
        self.format_error: str | None
        self.task, self.format_error = parse_body(self.raw_body)
        preemptions = self.task.preemptions if self.task is not None else 0
        self.attempt = max(1, self.dequeue_count - preemptions)
        self._failed_client: QueueClient | None = None
        self._settled = False
        self._recorded = False  # dead_letter sent its record already
        self._unanswered = False  # a settlement call failed without an answer: maybe applied

    def __repr__(self) -> str:
        return f"StorageQueueLease(message_id={self.message_id!r}, attempt={self.attempt})"

    def _call(self, what: str, fn: Callable[[QueueClient], T], finish: bool = True) -> T:
        """One call on a lease client; a LeaseLost ends the lease unless not ``finish``."""
        what = f"{what} {self.message_id}"
        if self._settled:
            raise settled_error(what)
        client, ok = self._backend.lease_client(), False
        try:
            with mapped_errors(what, SDK_ERRORS, self._backend.translate_lease,
                               on_lost=self._finish if finish else None):
                result = fn(client)
            ok = True
            return result
        finally:
            self._backend.return_client(client, ok)

    def _finish(self) -> None:
        self._settled = True
        if self._failed_client is not None:
            self._failed_client.close()
        self._failed_client = None

    def renew(self, timeout: float) -> float:
        """LeaseKeeper thread: hide the message for another ``lock_duration`` seconds.

        Gives up within ``timeout``: connect + read timeouts add up to it and the SDK does
        not retry.  A call that times out after the service applied it leaves us with a
        stale pop receipt, so the next renewal reports LeaseLost -- early, never late.
        """
        if timeout <= 0:
            raise BackendError(f"renew {self.message_id}: no time left")
        connect = min(self._backend.connect_timeout, timeout / 2)
        server = min(30, max(1, int(timeout)))  # server side: whole s, max 30
        visibility = int(self.lock_duration)
        # After a settlement call without an answer, a refused renewal may mean that call was
        # applied: the lease stays open for the settlement's retry to tell (``_settle``).
        updated = self._call("renew", lambda c: c.update_message(
            self.message_id, pop_receipt=self._pop_receipt, visibility_timeout=visibility,
            connection_timeout=connect, read_timeout=timeout - connect, timeout=server),
            finish=not self._unanswered)
        self._pop_receipt = updated.pop_receipt
        return float(visibility)

    def complete(self) -> None:
        """LeaseKeeper thread: delete the message for good."""
        self._delete("complete")

    def _delete(self, what: str) -> None:
        """Delete the message (LeaseKeeper thread).  A retry that finds it gone (404
        MessageNotFound) after a delete without an answer: ours, deleted -- nobody else
        could delete a message hidden by our lock, and the keeper retries only within it.
        (Counted as lock lost, a drain through a slow Azurite showed 841 of 1,000 tasks
        "lost" that had all run and been deleted.)"""
        self._settle(what, lambda c: c.delete_message(self.message_id, self._pop_receipt),
                     MessageGone)

    def _settle(self, what: str, fn: Callable[[QueueClient], object],
                applied: type[LeaseLost]) -> None:
        """One settlement call, then the lease is over (LeaseKeeper thread).

        A call that failed without an answer (a timeout, a 5xx) may have been applied; when
        its retry is refused with ``applied``, it was, and the settlement is done, not a
        lost lease."""
        try:
            self._call(what, fn)
        except LeaseLost as exc:
            if not (self._unanswered and isinstance(exc, applied)):
                raise
            LOG.debug("%s %s: applied by the call that got no answer", what, self.message_id)
            return  # _call's on_lost finished the lease
        except BackendError:
            self._unanswered = True
            raise
        self._finish()

    def release(self, count_attempt: bool, delay: float = 0.0) -> None:
        """LeaseKeeper thread: visible again after ``delay`` s (0..7 days).  A preemption
        (``count_attempt=False``) also writes the incremented preemption count."""
        content = None
        if not count_attempt and self.task is not None:
            try:
                content = self.task.with_preemption().to_json()
            except TaskFormatError as exc:  # one more digit pushed it over the size limit
                LOG.warning("preemption of %s not recorded: %s", self.message_id, exc)
        visibility = clamp_visibility(delay, 0)
        # A release applied by a call without an answer made the message visible, and another
        # receive (ours, too) took or finished it: the pop receipt no longer matches, or the
        # message is gone -- either refusal means released, not lost.
        self._settle("release", lambda c: c.update_message(
            self.message_id, pop_receipt=self._pop_receipt, content=content,
            visibility_timeout=visibility), LeaseLost)

    def dead_letter(self, reason: str, output_tail: str, exit_status: int | None = None) -> None:
        """LeaseKeeper thread: record in ``<queue>-failed``, then delete the message.

        Record first: if the delete then fails, the task may fail twice, never vanish.  A
        retry after a failed delete does not send a second record.
        """
        if self._settled:
            raise settled_error(f"dead-letter {self.message_id}")
        backend = self._backend
        if not self._recorded:
            record = make_record(self.raw_body, self.task, reason, self.attempt, exit_status,
                                 output_tail, backend.worker_id, self.message_id)
            if self._failed_client is None:
                self._failed_client = backend.new_client(backend.failed_queue_name)
            try:
                try:
                    self._failed_client.send_message(record, time_to_live=-1)
                except SDK_ERRORS as exc:
                    if not backend.recreate_if_missing(exc, self._failed_client):
                        raise
                    self._failed_client.send_message(record, time_to_live=-1)
            except SDK_ERRORS as exc:
                raise backend.translate(exc, f"dead-letter {self.message_id}") from None
            self._recorded = True
        self._delete("dead-letter")
