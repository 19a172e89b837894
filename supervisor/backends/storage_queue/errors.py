"""Helpers of the Storage Queue backend: error mapping, failed records (azure_common.py has
what it shares with Service Bus).

Kept apart from backends/storage_queue/backend.py so that module stays about the queue protocol
itself.
Nothing here talks to the network.
"""

from __future__ import annotations

import json
import math
import time

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    DeserializationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)

from ...core.azure_account import error_code
from ...core.task import MAX_BODY_BYTES, Task
from ..azure_common import Scrubber, detail
from ..base import BackendConfigError, BackendError, FailedRecord, LeaseLost
from ..common import command_of

# What may escape an SDK call besides AzureError: a response that is not UTF-8 or not XML,
# or a socket error the transport did not wrap.
SDK_ERRORS = (AzureError, DeserializationError, UnicodeDecodeError, OSError)
MAX_VISIBILITY = 604800  # 7 days, the service's limit for visibility timeouts
RECORD_MARK = "jobq_failed_record"  # a key only our dead-letter records carry
_MAX_REASON = 4000


def message_text(content: object) -> str:
    # The SDK's default (no-op) decode policy hands out the XML text as str; its requests
    # transport already decoded the HTTP body with errors="replace", so bytes that are not
    # UTF-8 arrive as U+FFFD and the body is poison rather than a crash.  bytes only appear
    # with a binary decode policy, which we do not use; handled all the same.
    if content is None:
        return ""
    if isinstance(content, bytes):
        return content.decode("utf-8", "replace")
    return str(content)


def clamp_visibility(seconds: float, minimum: int) -> int:
    """Whole seconds in minimum..7 days (the service takes integers only)."""
    if not math.isfinite(seconds):
        return MAX_VISIBILITY
    return int(max(minimum, min(MAX_VISIBILITY, math.ceil(seconds))))


class MessageGone(LeaseLost):
    """404 MessageNotFound on a lease's call: the message no longer exists.  After a delete
    whose answer never came, that is our own delete, applied (backends/storage_queue/lease.py)."""


def translate(exc: BaseException, what: str, scrub: Scrubber, lease: bool = False) -> Exception:
    """Map an SDK exception onto LeaseLost / BackendError / BackendConfigError.

    ``lease``: the call was about one received message, so "not found" and a pop-receipt
    mismatch mean another worker (or a lapse of visibility) took it: LeaseLost.
    The result carries only a scrubbed summary; callers raise it ``from None`` so the SDK's
    exception (with request details) is not chained into logs.
    """
    status = getattr(getattr(exc, "response", None), "status_code", None)
    status = status or getattr(exc, "status_code", None)
    code = error_code(exc)
    first_line = str(getattr(exc, "message", None) or exc).splitlines()[0] if str(exc) else ""
    summary = detail(exc, first_line, scrub)
    parts = [str(p) for p in (status, code) if p]
    tag = f" [{' '.join(parts)}]" if parts else ""
    if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
        return BackendConfigError(f"{what}: not authorized{tag}: {summary}")
    if lease and code == "MessageNotFound":
        return MessageGone(f"{what}: message gone or taken by another receiver{tag}")
    if lease and (status == 404 or code == "PopReceiptMismatch"):
        return LeaseLost(f"{what}: message gone or taken by another receiver{tag}")
    if status == 404 and code == "QueueNotFound":
        return BackendError(f"{what}: queue does not exist (deleted?){tag}")
    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        return BackendError(f"{what}: network error or timeout: {summary}")
    if isinstance(exc, (DeserializationError, UnicodeDecodeError)):
        return BackendError(f"{what}: could not decode the service's response: {summary}")
    if isinstance(exc, (HttpResponseError, AzureError, OSError)):
        return BackendError(f"{what}: failed{tag}: {summary}")
    return BackendError(f"{what}: unexpected {summary}")


def make_record(body: str, task: Task | None, reason: str, attempts: int, exit_status: int | None,
                output_tail: str, worker: str, message_id: str) -> str:
    """The JSON text of a dead-letter record, trimmed to fit one message.

    The original body is kept as a JSON object when it is one (no re-escaping, so a 60 KiB
    task still fits), else as a string.  ASCII-only JSON: no character can break the XML
    the service wraps messages in.  Trimmed in this order: output tail (its end is kept),
    reason, then the body itself (marked ``body_truncated``; such a record cannot be
    requeued).
    """
    record: dict[str, object] = {
        RECORD_MARK: 1,
        "id": task.id if task is not None else message_id,
        "reason": reason[:_MAX_REASON],
        "attempts": attempts,
        "exit_status": exit_status,
        "worker": worker,
        "failed_at": time.time(),
        "message_id": message_id,
        "output_tail": output_tail,
    }
    try:
        original = json.loads(body)
    except (ValueError, RecursionError):
        original = None
    if isinstance(original, dict):
        record["task"] = original
    else:
        record["body"] = body

    if len(json.dumps(record)) > MAX_BODY_BYTES and output_tail:
        _fit(record, "output_tail", output_tail, keep_end=True)
    if len(json.dumps(record)) > MAX_BODY_BYTES:
        raw = json.dumps(record.pop("task")) if "task" in record else str(record.pop("body"))
        record["body_truncated"] = True
        _fit(record, "body", raw, keep_end=False)
    return json.dumps(record)


def _fit(record: dict[str, object], key: str, value: str, keep_end: bool) -> None:
    """Set record[key] to the longest head (or tail) of value that keeps the record small
    enough.  Binary search, as JSON escaping makes the encoded size non-linear."""

    def part(n: int) -> str:
        if n == 0:
            return ""
        return value[-n:] if keep_end else value[:n]

    lo, hi = 0, len(value)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        record[key] = part(mid)
        if len(json.dumps(record)) <= MAX_BODY_BYTES:
            lo = mid
        else:
            hi = mid - 1
    record[key] = part(lo)


def parse_record(text: str, message_id: str) -> tuple[FailedRecord, str | None]:
    """A message of the failed queue -> (record, body to requeue or None if impossible).

    Messages that are not our records (an ai4s-jobq worker puts bare task envelopes into
    ``<queue>-failed``) are shown as such and requeued as they are.
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or RECORD_MARK not in data:
        reason = "not a jobq-supervisor failure record"
        if isinstance(data, dict) and data.get("error"):
            reason = str(data["error"])
        return FailedRecord(id=_str_id(data, message_id), attempts=0, reason=reason,
                            command=command_of(text), body=text), text
    if "task" in data:
        body: str | None = json.dumps(data["task"])
    else:
        body = None if data.get("body_truncated") else str(data.get("body", ""))
    exit_status = data.get("exit_status")
    failed_at = data.get("failed_at")
    record = FailedRecord(
        id=str(data.get("id") or message_id),
        attempts=_int(data.get("attempts")),
        reason=str(data.get("reason", "")),
        command=command_of(body or ""),
        output_tail=str(data.get("output_tail") or ""),
        exit_status=exit_status if isinstance(exit_status, int) else None,
        worker=str(data["worker"]) if data.get("worker") else None,
        failed_at=float(failed_at) if isinstance(failed_at, (int, float)) else None,
        body=body or "",
    )
    return record, body


def _str_id(data: object, fallback: str) -> str:
    if isinstance(data, dict) and isinstance(data.get("id"), str) and data["id"]:
        return data["id"]
    return fallback


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
