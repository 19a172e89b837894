"""Azure Storage Queue backend (azure-storage-queue), behind the Backend/Lease seam.

Wire format: plain JSON text (the ai4s-jobq v1 envelope, see core/task.py), no base64, sent with
``time_to_live=-1`` (never expires).  A lease is the message's visibility timeout: renewing
is ``update_message`` without content, which returns a new pop receipt that the next call
must use.  Attempts are ``dequeue_count - jobq_preemptions``: a preemption rewrites the body
with the count incremented, so giving the message back does not use up an attempt.
Failed tasks go to ``<queue>-failed`` as JSON records (errors.make_record).

Threads: Azure SDK clients are not documented thread-safe, so no client is shared between
threads.  The backend's own two clients are used by the main thread only.  A LeaseKeeper's
call takes an idle client (``lease_client``) and gives it back after it (``return_client``):
one call, one thread, and a client whose call failed -- its connection may hang -- is closed.
A single client behind a lock would be simpler, but then one renewal hanging on a dead
connection (up to its timeout) would hold back every other lease's renewal past its
deadline; a client per lease paid a pipeline and a new connection per task.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, TypeVar, Union

from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueClient, QueueMessage

from ...core.azure_account import error_code
from ...core.task import Task, parse_or_body
from ..azure_common import FAILED_SUFFIX, AzureBackendState, matches, reset_for_requeue
from ..base import (
    Backend,
    BackendBase,
    BackendConfigError,
    FailedRecord,
    Lease,
    QueueStatus,
)
from ..common import held_until, mapped_errors
from .errors import (
    SDK_ERRORS,
    clamp_visibility,
    message_text,
    parse_record,
    translate,
)
from .lease import StorageQueueLease

if TYPE_CHECKING:
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential, TokenCredential

    # what QueueClient takes beside a connection string (none: a SAS in the URL)
    Credential = Union[AzureNamedKeyCredential, AzureSasCredential, TokenCredential, None]

__all__ = ["StorageQueueBackend", "StorageQueueLease"]
LOG = logging.getLogger("supervisor.backends.storage_queue")  # pinned (layout move)
T = TypeVar("T")

QUEUED_NOTE = ("Storage Queue cannot tell pending from running or backing-off messages: "
               "queued counts all of them")
MAX_HIDDEN = 7 * 86400  # s: the service's longest visibility timeout
_PAGE = 32  # the service returns at most 32 messages per receive or peek
IDLE_CLIENTS = 64  # lease keepers' clients kept between calls
_LIST_VISIBILITY = 60  # s a failed record stays hidden while failed()/requeue() pages through
_NOT_ALLOWED_TO_CREATE = ("AuthorizationPermissionMismatch", "AuthorizationResourceTypeMismatch",
                          "AuthorizationFailure")
_QUEUE_NAME = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]+[a-z0-9]$")  # 3 characters at least


class StorageQueueBackend(AzureBackendState, BackendBase):
    """A Storage Queue and its ``-failed`` companion.  Main thread unless stated."""

    name = "storage-queue"
    tells_age = True  # ``oldest_pending_age``: one peek
    # Receive-ahead: one call takes up to 32 messages, a call per task fewer; a held message
    # goes back (visible at once, attempt unchanged) when it cannot start soon
    # (worker/receive_ahead.py).
    receive_ahead = True
    max_receive: int | None = _PAGE
    # A lapsed visibility timeout makes the message visible; slack for a renewal in transit.
    lost_lease_return_delay = 2.0
    lost_lease_return = "the message becomes visible again when its visibility timeout ends"
    # push --delay: the initial visibility timeout, which the service caps at 7 days
    max_delay: float | None = MAX_HIDDEN
    unique_by_control = True  # no index of messages: claims in the control store

    def __init__(self, queue: str, *, connection_string: str | None = None,
                 account_url: str | None = None, worker_id: str = "",
                 credential: Credential = None, connect_timeout: float = 5.0,
                 read_timeout: float = 20.0, create: bool = True,
                 create_failed: bool = True) -> None:
        """Connect and create ``queue`` and ``queue-failed`` when missing.

        ``create_failed=False`` (a worker) makes ``queue-failed`` at its first record instead:
        one round trip less before the first receive.

        ``create=False`` (read-only commands) creates nothing: a missing ``queue`` is a
        BackendError here, and a missing ``-failed`` companion reads as empty.

        Exactly one of ``connection_string`` / ``account_url``.  With an account URL the
        credential is ``credential``, a SAS token in the URL, or DefaultAzureCredential.
        Every request gets ``connect_timeout``/``read_timeout`` and no SDK retries: callers
        retry BackendError themselves, and nothing may hang for a minute in SDK backoff.
        """
        if bool(connection_string) == bool(account_url):
            raise BackendConfigError(
                "storage-queue needs exactly one of a connection string or an account URL")
        if not _QUEUE_NAME.match(queue) or len(queue) + len(FAILED_SUFFIX) > 63:
            raise BackendConfigError(
                f"bad Storage Queue name {queue!r}: lowercase letters, digits and single "
                f"hyphens, 3..{63 - len(FAILED_SUFFIX)} characters (room for '-failed')")
        self._init_azure(queue, worker_id, connection_string, account_url, translate)
        self.failed_queue_name = queue + FAILED_SUFFIX
        # The queues this process made at start it makes again when they vanish (an
        # emulator restarted in memory, a mistaken delete); a read-only command made none.
        self.recreate = create
        self._account_url = account_url
        self.connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._credential = credential
        if account_url and credential is None and "?" not in account_url:
            from azure.identity import DefaultAzureCredential  # only this path needs it

            # Shared by every client, also across lease threads: azure-identity credentials
            # are meant to be shared (their token caches lock internally).
            self._credential = DefaultAzureCredential()
        self._idle_clients: list[QueueClient] = []  # for lease keepers' calls
        self._main = self.new_client(self.queue_name)
        self._failed = self.new_client(self.failed_queue_name)
        self._endpoint = self.scrub(self._main.url.split("?", 1)[0])
        try:
            if create:
                for client in (self._main, self._failed)[:2 if create_failed else 1]:
                    self._create(client)
            else:
                self._count(self._main)  # QueueNotFound -> "does not exist", nothing made
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"StorageQueueBackend(queue={self.queue_name!r}, endpoint={self._endpoint!r})"

    def new_client(self, queue_name: str) -> QueueClient:
        """Any thread: a new client, to be used by one thread only."""
        connect, read = self.connect_timeout, self._read_timeout
        try:
            if self._connection_string:
                return QueueClient.from_connection_string(
                    self._connection_string, queue_name, retry_total=0,
                    connection_timeout=connect, read_timeout=read)
            assert self._account_url is not None
            return QueueClient(self._account_url, queue_name, credential=self._credential,
                               retry_total=0, connection_timeout=connect, read_timeout=read)
        except ValueError as exc:  # malformed connection string or URL
            raise BackendConfigError(
                f"storage-queue: bad connection string or account URL: {self.scrub(str(exc))}"
            ) from None

    def recreate_if_missing(self, exc: BaseException, client: QueueClient) -> bool:
        """Any thread, with its own ``client``: True when ``exc`` says the client's queue
        does not exist and this backend made it again (a queue it would make at start)."""
        if not self.recreate or error_code(exc) != "QueueNotFound":
            return False
        if client.queue_name == self.failed_queue_name:  # not made at start: not a loss
            LOG.info("queue %s does not exist; creating it", client.queue_name)
        else:
            LOG.warning("queue %s does not exist (deleted?); creating it again",
                        client.queue_name)
        self._create(client)
        return True

    def _create(self, client: QueueClient) -> None:
        """Any thread, with its own ``client``: create its queue unless it exists."""
        try:
            client.create_queue()
        except ResourceExistsError:
            pass  # exists already (perhaps with other metadata): fine
        except SDK_ERRORS as exc:
            if error_code(exc) in _NOT_ALLOWED_TO_CREATE:
                # Valid credentials that may only use messages (a SAS for objects, the
                # "Message Processor" roles): the queue may well exist.  If it does not,
                # the first real call says so.  Bad credentials still fail here.
                LOG.warning("not allowed to create queue %s; assuming it exists",
                            client.queue_name)
                return
            raise self.translate(exc, f"create queue {client.queue_name}") from None

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        with mapped_errors(what, SDK_ERRORS, self.translate):
            return fn()

    def receive(self, max_messages: int, lock_duration: float) -> list[Lease]:
        """Take up to ``max_messages`` (at most 32), hidden for ``lock_duration`` seconds."""
        if max_messages < 1:
            return []
        visibility = clamp_visibility(lock_duration, 1)
        pages = self._main.receive_messages(messages_per_page=min(_PAGE, max_messages),
                                            visibility_timeout=visibility).by_page()
        try:
            messages = list(next(pages, []))
        except SDK_ERRORS as exc:
            if self.recreate_if_missing(exc, self._main):
                return []  # empty, just made: the next receive asks again
            raise self.translate(exc, "receive") from None
        return [StorageQueueLease(self, message, visibility) for message in messages]

    def push(self, tasks: Sequence[Task]) -> list[str]:
        """Send each task; return their task ids.  Raises on the first failure (the tasks
        before it are queued)."""
        ids = []
        for task in tasks:
            # a delayed task is sent invisible until its time (whole seconds, rounded up)
            hidden = math.ceil(task.not_before - time.time()) if task.not_before else 0
            with mapped_errors(f"push {task.id}", SDK_ERRORS, self.translate):
                self._main.send_message(task.to_json(), time_to_live=-1,
                                        visibility_timeout=min(max(hidden, 0), MAX_HIDDEN)
                                        or None)
            ids.append(task.id)
        return ids

    def size(self) -> int:
        """Approximate count, including messages other workers hold invisible."""
        return self._count(self._main)

    def _count(self, client: QueueClient) -> int:
        props = self._call(f"queue {client.queue_name}", client.get_queue_properties)
        return int(props.approximate_message_count or 0)

    def _count_failed(self) -> int | None:
        """Records in ``-failed``; None when that queue does not exist (read-only commands
        do not make it, and a queue made by another tool may lack it): read as empty."""
        try:
            props = self._failed.get_queue_properties()
        except SDK_ERRORS as exc:
            if error_code(exc) == "QueueNotFound":
                return None
            raise self.translate(exc, f"queue {self.failed_queue_name}") from None
        return int(props.approximate_message_count or 0)

    def peek(self, n: int) -> list[Task | str]:
        """Up to ``min(n, 32)`` visible messages (the service's peek limit); poison as text.
        Only visible messages are peeked, so none is held back (``held_until``): a requeued
        task's body may still name the time it was first pushed to wait for."""
        if n < 1:
            return []
        messages = self._call("peek", lambda: self._main.peek_messages(max_messages=min(n, _PAGE)))
        out: list[Task | str] = []
        for message in messages:
            out.append(held_until(parse_or_body(message_text(message.content)), None, 0.0))
        return out

    def oldest_pending_age(self, now: float) -> float | None:
        """Seconds since the first visible message was inserted (one peek; jobq-ctl status),
        or None when none is visible.  Messages hidden for a retry or held by a worker are
        not seen, so this is the age of the oldest task waiting for a worker now."""
        messages = self._call("peek", lambda: self._main.peek_messages(max_messages=1))
        for message in messages:
            if message.inserted_on is not None:
                # a delayed task (push --delay) is queued from its time, not from its push
                task = parse_or_body(message_text(message.content))
                since = max(message.inserted_on.timestamp(), getattr(task, "not_before", 0)
                            or 0)
                return max(0.0, now - since)
        return None

    def status(self) -> QueueStatus:
        """``queued``, not ``pending``: the service's count includes the messages workers
        hold invisible (running) and those hidden for a retry delay (backing off)."""
        return QueueStatus(counts={"queued": self.size(), "failed": self._count_failed() or 0},
                           note=QUEUED_NOTE)

    def failed(self) -> list[FailedRecord]:
        """Every record of ``<queue>-failed``.  Peek stops at 32, so this receives the
        records (hidden for 60 s) and makes them visible again afterwards; a concurrent
        lister sees fewer meanwhile."""
        if self._count_failed() is None:
            return []
        taken = self._take_failed()
        try:
            return [parse_record(message_text(m.content), m.id)[0] for m in taken]
        finally:
            self._restore(taken)

    def requeue(self, ids: Sequence[str] | None) -> int:
        """Move failed records (by task id or message id; None = all) back to the queue."""
        taken = self._take_failed()
        moved: set[str] = set()
        try:
            for message in taken:
                record, body = parse_record(message_text(message.content), message.id)
                if not matches(record, message.id, ids):
                    continue
                if body is None:
                    LOG.warning("cannot requeue %s: its body was truncated", record.id)
                    continue
                # Send first, then delete: a failure in between duplicates, never loses.
                with mapped_errors(f"requeue {record.id}", SDK_ERRORS, self.translate):
                    self._main.send_message(reset_for_requeue(body), time_to_live=-1)
                    self._failed.delete_message(message.id, message.pop_receipt)
                moved.add(message.id)
        finally:
            self._restore([m for m in taken if m.id not in moved])
        return len(moved)

    def _take_failed(self) -> list[QueueMessage]:
        taken: list[QueueMessage] = []
        # Stop paging well before the first records taken become visible again.
        deadline = time.monotonic() + _LIST_VISIBILITY / 2
        while time.monotonic() < deadline:
            with mapped_errors("list failed", SDK_ERRORS, self.translate):
                page = list(next(self._failed.receive_messages(
                    messages_per_page=_PAGE, visibility_timeout=_LIST_VISIBILITY).by_page(), []))
            if not page:
                return taken
            taken.extend(page)
        LOG.warning("listed %d failed records; more remain (time budget spent)", len(taken))
        return taken

    def _restore(self, messages: Sequence[QueueMessage]) -> None:
        for message in messages:
            try:
                self._failed.update_message(message.id, pop_receipt=message.pop_receipt,
                                            visibility_timeout=0)
            except SDK_ERRORS as exc:
                # Best effort: it reappears by itself after _LIST_VISIBILITY seconds.
                LOG.warning("%s", self.translate(exc, "restore failed record"))

    def clear(self, failed: bool) -> int:
        """Delete every message (also those leased right now); return the approximate count."""
        client = self._failed if failed else self._main
        count = self._count(client)
        self._call("clear", client.clear_messages)
        return count

    def maintenance(self) -> None:
        """Nothing to do: the service returns lapsed messages by itself."""

    def lease_client(self) -> QueueClient:
        """Any thread: a client of the queue for one call, then ``return_client`` -- a
        client is used by one thread at a time (SDK clients are not documented thread-safe),
        and a lease keeper takes an idle one instead of making its own: a client per lease
        (its pipeline, its TCP connection) was ~1/3 of a short task's CPU in the supervisor."""
        try:
            return self._idle_clients.pop()  # list.pop/append are atomic
        except IndexError:
            return self.new_client(self.queue_name)

    def return_client(self, client: QueueClient, ok: bool) -> None:
        """Any thread: done with ``client``.  One whose call failed is closed (its connection
        may hang, or be half-read); the others are kept, up to IDLE_CLIENTS."""
        if ok and len(self._idle_clients) < IDLE_CLIENTS:
            self._idle_clients.append(client)
        else:
            client.close()

    def close(self) -> None:
        idle = getattr(self, "_idle_clients", [])
        for client in (getattr(self, "_main", None), getattr(self, "_failed", None), *idle):
            if client is not None:
                client.close()


if TYPE_CHECKING:  # mypy: both classes satisfy the protocols of base.py

    def _conforms(backend: StorageQueueBackend, lease: StorageQueueLease) -> tuple[Backend, Lease]:
        return backend, lease
