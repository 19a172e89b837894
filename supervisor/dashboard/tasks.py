"""The task and failed pages' reads and writes (waitress's request threads): an attempt's
output read by offset from the output store, the failed and cancelled listing, and the
cancel / requeue / clear actions with ``jobq-ctl``'s semantics (the same functions of
ops/fleet.py, ops/queue.py and ops/output.py, each thread with its own clients from
DataSource).

The output API never sends more than CAP bytes per call: a reader that is further behind (a
task printing 200 MB) jumps to the last CAP bytes and is told how many it skipped, so an open
page costs at most CAP bytes per poll whatever the task prints.
"""

from __future__ import annotations

from typing import Any

from ..backends.task_list import TaskQuery, next_cursor
from ..fleet.control.base import CANCEL_TTL
from ..fleet.output.base import AttemptKey
from ..ops.fleet import cancel_tasks
from ..ops.output import output_end
from ..ops.queue import all_failed_ids, forget_cancels, requeue_ids
from ..ops.task_ends import failed_listing
from ..ops.task_list import list_tasks, row_json
from ..ops.times import iso_times
from .data import DataSource

CAP = 256 << 10  # bytes of output one API call returns at most (and the page keeps)
GRACE = 30.0  # s between SIGTERM and SIGKILL on cancel: jobq-ctl cancel's --grace default
SHOWN = 500  # failed tasks one page lists


def output_json(data: DataSource, task_id: str, attempt: int, offset: int | None
                ) -> dict[str, Any]:
    """The attempt's output after ``offset`` (None: the last CAP bytes), cut at the last
    complete line while the attempt is still written, decoded as UTF-8 (bad bytes replaced).
    ``skipped``: bytes between ``offset`` and what ``data`` starts with."""
    store = data.output()
    key = AttemptKey(data.queue, task_id, attempt)
    asked = offset or 0
    with data.using("output store"):
        start = asked
        if offset is None:
            start = max(0, output_end(store, key) - CAP)
        chunk = store.read(key, start, CAP + 1)
        if len(chunk.data) > CAP:  # behind by more than CAP: the tail only
            start = max(start, output_end(store, key) - CAP)
            chunk = store.read(key, start, CAP)
    body, complete = chunk.data[:CAP], chunk.complete and len(chunk.data) <= CAP
    if start > asked and b"\n" in body[:-1]:
        cut = body.index(b"\n") + 1  # whole lines only after a jump
        body, start = body[cut:], start + cut
    if not complete and b"\n" in body and not body.endswith(b"\n"):
        body = body[:body.rindex(b"\n") + 1]  # the partial last line comes with the next poll
    return {"task_id": task_id, "attempt": attempt, "offset": start,
            "next_offset": start + len(body), "skipped": start - asked,
            "complete": complete and start + len(body) == chunk.offset,
            "data": body.decode("utf-8", "replace")}


def output_attempts(data: DataSource, task_id: str) -> list[int]:
    """The attempts with stored output; Unavailable when the output store is down."""
    store = data.output()
    with data.using("output store"):
        return store.attempts(data.queue, task_id)


# ----------------------------------------------------------------------------- failed
def failed_json(data: DataSource) -> tuple[list[dict[str, Any]], int]:
    """(the failed and cancelled tasks, newest first, at most SHOWN; how many there are):
    the rows ``jobq-ctl failed --json`` prints (task_ends.failed_listing, field by field),
    without a control store the backend's part only."""
    with data.using("queue"):
        records = data.backend().failed()
    rows, warning = failed_listing(records, data.optional_store(), data.queue)
    if warning is not None:
        data.close_thread()  # a broken store connection must not serve the next request
    rows.sort(key=lambda row: row["failed_at"] or 0.0, reverse=True)
    return [iso_times(row) for row in rows[:SHOWN]], len(rows)


# ---------------------------------------------------------------------------- actions
def cancel(data: DataSource, task_id: str, by: str) -> str | None:
    """``jobq-ctl cancel ID`` with the default grace: what happened, or None when the task
    is known to have ended already (SQLite and PostgreSQL tell; elsewhere the cancel is
    recorded)."""
    live, taken = _cancel(data, [task_id], by)
    if not live:
        return None
    if task_id in taken:
        return "cancelled (it was pending and will not run)"
    return "cancel recorded: its worker stops it (SIGTERM, SIGKILL after 30s)"


def requeue(data: DataSource, ids: list[str] | None) -> int:
    """``jobq-ctl requeue IDS`` (None: ``--all-failed``, cancelled tasks not included): how
    many came back; their cancel records are forgotten so that the next worker runs them."""
    with data.using("queue"):
        backend = data.backend()
        known = all_failed_ids(backend, False) if ids is None else ids
        n = requeue_ids(backend, known) if ids is None else backend.requeue(ids)
    forget_cancels(data.queue, known, data.optional_store())
    return n


def failed_count(data: DataSource) -> int:
    """How many failed tasks the queue keeps (what clear deletes)."""
    with data.using("queue"):
        return len(data.backend().failed())


def clear_failed(data: DataSource) -> int:
    """``jobq-ctl clear --failed``: how many failed tasks were deleted."""
    with data.using("queue"):
        return data.backend().clear(failed=True)


# ----------------------------------------------------------------------------- browse
def task_page(data: DataSource, query: TaskQuery) -> tuple[list[dict[str, Any]],
                                                          str | None, str | None]:
    """(a page of the queue's tasks as ``jobq-ctl tasks --json`` prints them, the cursor of
    the next page or None, a note on what the listing cannot see)."""
    with data.using("queue"):
        rows, note = list_tasks(data.backend(), data.optional_store(), data.queue, query)
    return [row_json(r) for r in rows], next_cursor(rows, query), note


def cancel_many(data: DataSource, ids: list[str], by: str) -> int:
    """``jobq-ctl cancel IDS`` with the default grace: how many were still live (a pending
    one never runs; a running one's worker stops it)."""
    live, _ = _cancel(data, ids, by)
    return len(live)


def _cancel(data: DataSource, ids: list[str], by: str) -> tuple[list[str], set[str]]:
    """ops.fleet.cancel_tasks with the default grace on the ids the queue still holds where it
    tells (``Backend.admin``): (those still live, so cancelled; those taken off the queue)."""
    backend = data.backend()
    states = None
    admin = backend.admin()
    if admin is not None:
        with data.using("queue"):
            states = admin.task_states(ids)
        ids = [i for i in ids if i in states]  # unknown, or gone meanwhile (cleared, purged)
        if not ids:
            return [], set()
    with data.using("control store"):
        return cancel_tasks(backend, data.store(), data.queue, ids, states, "", GRACE,
                            CANCEL_TTL, data.key, by)
