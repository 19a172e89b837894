"""What the two Azure backends share: secret scrubbing, the constructor state a lease reads
(names, the SDK error mapping), short error details, the rules of
``jobq-ctl requeue`` (which records match, what a requeued body looks like) and which queue
names are where failed tasks go.  Nothing here talks to the network.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import Protocol

from .base import FailedRecord

FAILED_SUFFIX = "-failed"  # Storage Queue: failed tasks of queue Q go to Q-failed


def failed_queue_of(backend: str, queue: str) -> str | None:
    """The queue whose failed tasks ``queue`` holds, when it is such a queue (so no task may be
    pushed into it: a worker would read a failure record, not a task); else None.  Service
    Bus's dead-letter sub-queue (``Q/$DeadLetterQueue``) never gets here: core/settings.py refuses a
    queue name with ``/`` or ``$``."""
    if backend == "storage-queue" and queue.endswith(FAILED_SUFFIX) \
            and len(queue) > len(FAILED_SUFFIX):
        return queue[:-len(FAILED_SUFFIX)]
    return None


class Scrubber:
    """Removes secrets (connection string, account key, SAS signature, Service Bus
    SharedAccessKey) from text.  Any thread (read-only after construction)."""

    def __init__(self, connection_string: str | None, account_url: str | None) -> None:
        secrets: list[str] = []
        if connection_string:
            secrets.append(connection_string)
            for part in connection_string.split(";"):
                key, _, value = part.partition("=")
                if key.strip().lower() in ("accountkey", "sharedaccesssignature",
                                                 "sharedaccesskey") and value:
                    secrets.append(value.strip())
        if account_url and "?" in account_url:
            secrets.append(account_url.split("?", 1)[1])  # a SAS token in the URL
        # Longest first, so a secret containing another is removed whole.
        self._secrets = sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


class Translate(Protocol):
    """An Azure backend's ``errors.translate``: an SDK error as the seam's."""

    def __call__(self, exc: BaseException, what: str, scrub: Scrubber,
                 lease: bool = False) -> Exception: ...


class LeaseHome(Protocol):
    """What a lease of either Azure backend reads of the backend that received it (which
    hands itself in: no import of it in the lease modules).  Read on any thread."""

    @property
    def queue_name(self) -> str: ...

    @property
    def worker_id(self) -> str: ...

    def translate_lease(self, exc: BaseException, what: str) -> Exception:
        """An SDK error about this one message as the seam's: "gone" is LeaseLost."""
        ...


class AzureBackendState:
    """The constructor state both Azure backends share, a ``LeaseHome`` (set on the main
    thread before any lease exists, then only read: any thread)."""

    def _init_azure(self, queue: str, worker_id: str, connection_string: str | None,
                    account_url: str | None, translate: Translate) -> None:
        self.queue_name = queue
        self.worker_id = worker_id
        self._connection_string = connection_string
        self.scrub = Scrubber(connection_string, account_url)
        self.translate = partial(translate, scrub=self.scrub)
        self.translate_lease = partial(translate, scrub=self.scrub, lease=True)  # any thread


def short(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters (scrub before: a cut could split a secret)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def detail(exc: BaseException, first_line: str, scrub: Scrubber) -> str:
    """The scrubbed, shortened ``Type: first line`` of an SDK exception, for error messages."""
    return short(scrub(f"{type(exc).__name__}: {first_line}"))


def matches(record: FailedRecord, message_id: str, ids: Sequence[str] | None) -> bool:
    """Does ``jobq-ctl requeue IDS`` (None = all) mean this record (task or message id)?"""
    return ids is None or record.id in ids or message_id in ids


def reset_for_requeue(body: str) -> str:
    """The body to push again: preemption count back to 0 (attempts restart by themselves,
    as a new message's dequeue or delivery count starts at 0)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if isinstance(data, dict) and data.get("jobq_preemptions"):
        data["jobq_preemptions"] = 0
        return json.dumps(data)
    return body
