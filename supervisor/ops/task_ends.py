"""How a task ended, worded the same by every reader: ``jobq-ctl result``, ``push --wait``
and ``--follow``, ``logs -f``, ``failed``, and the dashboard's task and failed pages (the
caller's thread; everything here is pure or one store read).

**A task cancelled before it ran** (pending, delayed, or backing off before a retry) has no
worker to write its end: ``jobq-ctl cancel`` cannot know on Azure whether a task is pending
or running, so it cannot write a final record without contradicting the worker that may be
running it.  Its end is *derived* from its cancel record instead (``pending_cancel``): the
cancel is the promise every backend keeps (a worker receiving the task does not run it), a
``requeue`` that brings the task back deletes the cancel and with it the derived end, and the
cancel is purged after the same 7 days as result records.  It is derived only when no
attempt runs (no record, or the last one ended and was not final) and, on SQLite, when the
job row says the cancel took the pending task (failed); on Azure, where no reader can see the
message, once the cancel is SETTLE seconds old (a worker that had just received the task
writes its own record by then).

**The failed listing** (``failed_rows``): the backend's failed records (every backend keeps
cancelled tasks there, reason ``cancelled by ...``) with, from the control store, only the
record of the attempt that ended the task (final) -- never an earlier attempt's worker or
output -- and the cancel of a task cancelled before it ran.  ``jobq-ctl failed --json`` and
the dashboard's ``/api/failed`` print these rows as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

from ..backends.base import FailedRecord
from ..fleet.control.base import ControlStore, ControlStoreError
from ..fleet.control.records import Cancel, ResultRecord, cancel_reason

# s after its cancel when a task with no result record is taken as cancelled before it ran,
# where the queue cannot tell (Azure): a worker's claim-time record is written within ~1 s.
SETTLE = 10.0
NEVER_RAN = " (before it started)"  # what a worker's claim-time cancel record adds too
# Only these attempts can still be followed by another one (a retry or a rerun).
ENDED_NOT_FINAL = ("failed", "lock-lost", "requeued")


def is_cancelled(reason: str) -> bool:
    """Whether a failed record's reason says the task was cancelled (every backend keeps a
    cancelled task among the failed ones, with this reason)."""
    return reason.startswith("cancelled")


def pending_cancel(queue: str, records: Sequence[ResultRecord], cancel: Union[Cancel, None],
                   job: Union[str, None], now: float) -> Union[ResultRecord, None]:
    """The final ``cancelled`` record of a task cancelled before an attempt ran, derived from
    its ``cancel`` (None: no end to derive).  ``records``: the task's result records by
    attempt; ``job``: its SQLite job status, "?" where the queue cannot tell (Azure), None
    when the row is gone; ``now``: wall clock."""
    if cancel is None or now >= cancel.expires():
        return None
    last = records[-1] if records else None
    if last is not None and (last.final or last.outcome not in ENDED_NOT_FINAL):
        return None  # it ended otherwise, or an attempt runs: its worker writes the end
    if job == "?":
        if now - cancel.when < SETTLE:
            return None
    elif job != "failed":  # SQLite: pending or running is a worker's; gone is gone
        return None
    attempt = (last.attempt + (0 if last.outcome == "requeued" else 1)) if last else 1
    return ResultRecord(queue=queue, task_id=cancel.task_id, attempt=attempt,
                        outcome="cancelled", reason=cancel_reason(cancel) + NEVER_RAN,
                        tail="", exit_status=None, worker="", when=cancel.when,
                        finished=cancel.when, final=True,
                        max_attempts=last.max_attempts if last else None,
                        cancelled_by=cancel.who)


def read_pending_cancel(store: ControlStore, queue: str, task_id: str,
                        records: Sequence[ResultRecord], job: Callable[[], Union[str, None]],
                        now: float) -> Union[ResultRecord, None]:
    """``pending_cancel`` with the cancel read from ``store`` (one point lookup, none when
    an attempt's record already says how the task ends) and the job status from ``job``
    (called only when there is a cancel); raises ControlStoreError."""
    last = records[-1] if records else None
    if last is not None and (last.final or last.outcome not in ENDED_NOT_FINAL):
        return None
    cancel = store.get_cancel(queue, task_id)
    return None if cancel is None else pending_cancel(queue, records, cancel, job(), now)


# ----------------------------------------------------------------------- failed listing
def final_records(results: Iterable[ResultRecord]) -> dict[str, ResultRecord]:
    """Per task, its final failed or cancelled record (the newest, if several)."""
    found: dict[str, ResultRecord] = {}
    for r in results:
        if r.final and r.outcome in ("failed", "cancelled") and (
                r.task_id not in found or r.when >= found[r.task_id].when):
            found[r.task_id] = r
    return found


def failed_rows(records: Sequence[FailedRecord], finals: Mapping[str, ResultRecord],
                cancels: Mapping[str, Cancel]) -> list[dict[str, Any]]:
    """The failed and cancelled tasks as ``failed --json`` and ``/api/failed`` print them,
    in the backend's order.  ``finals``: ``final_records`` of the store's failed and
    cancelled listings; ``cancels``: the queue's cancels by task id (who cancelled a task
    that never ran).  Times are epoch seconds (the callers print ISO-8601)."""
    rows = []
    for f in records:
        r = finals.get(f.id)
        cancelled = is_cancelled(f.reason) or (r is not None and r.outcome == "cancelled")
        cancel = cancels.get(f.id) if cancelled else None
        by = (r.cancelled_by if r is not None else "") or (cancel.who if cancel else "")
        rows.append({"id": f.id, "state": "cancelled" if cancelled else "failed",
                     "attempts": f.attempts, "reason": f.reason or (r.reason if r else ""),
                     "command": f.command,
                     "exit_status": f.exit_status if f.exit_status is not None
                     else (r.exit_status if r else None),
                     "signal": r.signal if r else None,
                     "worker": f.worker or (r.worker if r else None) or None,
                     "failed_at": f.failed_at or (r.finished if r else None),
                     "cancelled_by": by or None,
                     "output_tail": f.output_tail or (r.tail if r else "")})
    return rows


def failed_listing(records: Sequence[FailedRecord], store: Union[ControlStore, None],
                   queue: str) -> tuple[list[dict[str, Any]], Union[str, None]]:
    """(``failed_rows`` of ``records``, the backend's failed listing of ``queue``; the
    control store's error or None).  Without a store, or when it fails, the rows hold what
    the backend keeps."""
    finals: dict[str, ResultRecord] = {}
    cancels: dict[str, Cancel] = {}
    warning = None
    if store is not None and records:
        try:
            finals = final_records(r for outcome in ("failed", "cancelled")
                                   for r in store.results(queue, outcome))
            if any(is_cancelled(f.reason) and f.id not in finals for f in records):
                cancels = {c.task_id: c for c in store.cancels(queue)}
        except ControlStoreError as exc:
            finals, cancels, warning = {}, {}, str(exc)
    return failed_rows(records, finals, cancels), warning
