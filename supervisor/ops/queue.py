"""What an operator does to a queue's failed tasks, as data: which ids ``requeue
--all-failed`` brings back, the requeue itself, the tasks taken back from a worker that is
gone, and forgetting the cancels of what comes back.  ``jobq-ctl`` (ctl/queue_commands.py)
and the dashboard's request threads call these, each with its own backend and store."""

from __future__ import annotations

import sys

from ..backends.base import Backend, TakenBack
from ..fleet.control.base import ControlStore, ControlStoreError
from .task_ends import is_cancelled


def all_failed_ids(backend: Backend, include_cancelled: bool) -> list[str]:
    """The ids ``requeue --all-failed`` brings back: every failed task, and the cancelled
    ones only with ``include_cancelled`` (an operator's cancel is not undone by a sweep)."""
    return [r.id for r in backend.failed() if include_cancelled or not is_cancelled(r.reason)]


def requeue_ids(backend: Backend, ids: list[str]) -> int:
    """``backend.requeue`` of ``ids`` (in chunks of ``Backend.requeue_chunk``, SQLite: one
    statement each); how many."""
    step = backend.requeue_chunk or max(1, len(ids))
    return sum(backend.requeue(ids[i:i + step]) for i in range(0, len(ids), step))


def taken_back(backend: Backend, ids: list[str]) -> dict[str, TakenBack]:
    """Those of ``ids`` the queue took back from a worker that is gone (id -> TakenBack),
    waiting a moment for one whose lifeline is still at work, where the queue tells
    (``Backend.admin``); {} on the others, whose leases come back by their lock alone."""
    admin = backend.admin()
    if admin is None or not ids:
        return {}
    return admin.take_back(ids)


def forget_cancels(queue: str, ids: list[str], store: ControlStore | None) -> None:
    """A requeued task that had been cancelled must run again: its cancel record would make
    the next worker cancel it at claim time.  Workers drop a deleted cancel from their cache
    within a minute (fleet/directives.py)."""
    if store is None or not ids:
        return
    try:
        cancelled = {c.task_id for c in store.cancels(queue)} & set(ids)
        for task_id in sorted(cancelled):
            store.delete_cancel(queue, task_id)
    except ControlStoreError as exc:
        print(f"jobq-ctl: warning: the cancels of the requeued tasks stay recorded ({exc}); "
              "a worker may cancel them again", file=sys.stderr)
