"""Rules every backend shares: reading a message body, what ``peek`` says of a task's time,
and mapping a failed call about one lease onto the seam's errors (base.py).  Nothing here
talks to a queue.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable

from ..core.task import Task, TaskFormatError
from .base import LeaseLost


def parse_body(body: str) -> tuple[Task | None, str | None]:
    """A received body -> (task, None), or (None, why it is poison) (the receiving thread)."""
    try:
        return Task.parse(body), None
    except TaskFormatError as exc:
        return None, poison_reason(exc, body)


def held_until(item: Task | str, until: float | None, now: float) -> Task | str:
    """A peeked task with ``not_before`` set to the time the queue holds it until (None:
    it is ready), whatever its body says: a requeued task's body keeps the time it was
    first pushed to wait for, and a retry's back-off is in no body (any thread)."""
    if not isinstance(item, Task):
        return item
    held = until if until is not None and until > now else None
    return item if held == item.not_before else replace(item, not_before=held)


def poison_reason(error: TaskFormatError, body: str) -> str:
    """The parse error plus a hint for the two common producer mistakes."""
    reason = str(error)
    if "\ufffd" in body:
        reason += " (the body had bytes that are not UTF-8; they were replaced by U+FFFD)"
    elif body and len(body) % 4 == 0 and not body.lstrip().startswith(("{", "[")):
        try:
            decoded = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            decoded = b""
        if decoded.lstrip().startswith(b"{"):
            reason += " (the body looks base64-encoded; send plain JSON text)"
    return reason


def command_of(body: str) -> str:
    """The shell command of a body, or "" when it is poison (for ``jobq-ctl failed``)."""
    try:
        return Task.parse(body).cmd
    except TaskFormatError:
        return ""


def settled_error(what: str) -> LeaseLost:
    """A call on a lease that was settled or lost already: never sent to the broker."""
    return LeaseLost(f"{what}: lease already settled or lost")


@contextmanager
def mapped_errors(what: str, errors: tuple[type[BaseException], ...],
                  translate: Callable[[BaseException, str], Exception],
                  on_lost: Callable[[], None] | None = None) -> Iterator[None]:
    """Raise an error of the block as ``translate`` maps it (the calling thread).

    A LeaseLost ends the lease first (``on_lost``), so it is never settled afterwards.  The
    result is raised ``from None``: the SDK's exception, with request details and perhaps
    secrets, is not chained into logs.
    """
    try:
        yield
    except errors as exc:
        error = translate(exc, what)
        if on_lost is not None and isinstance(error, LeaseLost):
            on_lost()
        raise error from None
