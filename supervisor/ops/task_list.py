"""A page of a queue's tasks for ``jobq-ctl tasks`` and the dashboard's tasks page, on every
backend (the caller's thread).

A queue that indexes its tasks (SQLite, PostgreSQL: ``Backend.admin``) answers the query
itself, newest first by keyset (backends/task_list.py).  Storage Queue and Service Bus keep no
index of task ids: a listing there is pieced together from what can be read -- the first
PEEKED messages of the queue (pending or delayed; a peek sees no further), the worker records
(running) and the result records of the control store (succeeded, failed, cancelled: the
final attempt of each task) -- and says so in its note.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Union

from ..backends.base import Backend
from ..backends.task_list import TASK_STATES, BadCursor, TaskQuery, TaskRow
from ..core.task import Task
from ..fleet.control.base import ControlStore, ControlStoreError, worker_state
from ..fleet.control.records import ResultRecord
from .times import iso_or_none

PEEKED = 32  # messages a Storage Queue peek returns at most (Service Bus peeks as many)
_SEP = "|"


def list_tasks(backend: Backend, store: Union[ControlStore, None], queue: str,
               query: TaskQuery) -> tuple[list[TaskRow], Union[str, None]]:
    """(a page of tasks, a note on what the listing could not see or None).  Raises
    BackendError; a control store error is the note."""
    now = time.time()
    admin = backend.admin()
    if admin is not None:
        return admin.list_tasks(query, now), None
    note = (f"this queue keeps no index of its tasks: pending ones are the first {PEEKED} "
            "messages a peek sees; running and finished ones come from the control store")
    rows = {r.id: r for r in _peeked(backend, now)}
    if store is None:
        note += " (none is configured)"
    else:
        try:
            # a record wins over a peek: Service Bus peeks the messages workers hold too
            rows.update((r.id, r) for r in _from_records(store, queue, now))
        except ControlStoreError as exc:
            note += f" (unavailable: {exc})"
    return _page(_filtered(list(rows.values()), query), query), note


def _peeked(backend: Backend, now: float) -> list[TaskRow]:
    rows = []
    for t in backend.peek(PEEKED):
        if isinstance(t, Task):
            delayed = t.not_before is not None and t.not_before > now
            rows.append(_row(t.id, "delayed" if delayed else "pending", 0, t.max_attempts,
                             t.cmd, t.not_before or now, None, None, None, None))
    return rows


def _from_records(store: ControlStore, queue: str, now: float) -> list[TaskRow]:
    rows: dict[str, TaskRow] = {}
    for r in _newest_per_task(store.results(queue)):
        if r.outcome in ("succeeded", "failed", "cancelled") and r.final:
            rows[r.task_id] = _row(r.task_id, r.outcome, r.attempt, r.max_attempts, "",
                                   r.started or r.when, r.finished, r.worker, r.reason or None,
                                   r.exit_status)
    for w in store.workers(queue):
        if worker_state(w, now) == "lost":
            continue
        for t in w.tasks:
            rows[t.id] = _row(t.id, "running", t.attempt, None, t.cmd, t.started, None, w.id,
                              None, None)
    return list(rows.values())


def _newest_per_task(records: Iterable[ResultRecord]) -> list[ResultRecord]:
    newest: dict[str, ResultRecord] = {}
    for r in records:
        if r.task_id not in newest or (r.attempt, r.when) >= (newest[r.task_id].attempt,
                                                              newest[r.task_id].when):
            newest[r.task_id] = r
    return list(newest.values())


def _row(task_id: str, state: str, attempt: int, most: Union[int, None], cmd: str,
         created: float, ended: Union[float, None], worker: Union[str, None],
         reason: Union[str, None], status: Union[int, None]) -> TaskRow:
    return TaskRow(id=task_id, state=state, attempt=attempt, max_attempts=most, cmd=cmd,
                   created=created, ended=ended, worker=worker, reason=reason,
                   exit_status=status, cursor=f"{created!r}{_SEP}{task_id}")


def _filtered(rows: list[TaskRow], q: TaskQuery) -> list[TaskRow]:
    text = (q.text or "").lower()
    return [r for r in rows if (not q.states or r.state in q.states)
            and (not q.worker or r.worker == q.worker) and text in r.cmd.lower()]


def _page(rows: list[TaskRow], q: TaskQuery) -> list[TaskRow]:
    rows.sort(key=lambda r: (r.created, r.id), reverse=True)
    if q.cursor:
        at, sep, last = q.cursor.partition(_SEP)
        try:
            after = (float(at), last)
        except ValueError:
            raise BadCursor(q.cursor) from None
        if not sep:
            raise BadCursor(q.cursor)
        rows = [r for r in rows if (r.created, r.id) < after]
    return rows[:q.limit]


def parse_states(text: str) -> tuple[str, ...]:
    """``--state failed,cancelled`` -> the states; ValueError naming an unknown one."""
    states = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in states if s not in TASK_STATES]
    if bad:
        raise ValueError(f"unknown state {bad[0]!r} (one of {', '.join(TASK_STATES)})")
    return states


def row_json(r: TaskRow) -> dict[str, Any]:
    return {"id": r.id, "state": r.state, "attempt": r.attempt,
            "max_attempts": r.max_attempts, "cmd": r.cmd, "created": iso_or_none(r.created),
            "ended": iso_or_none(r.ended), "worker": r.worker, "reason": r.reason,
            "exit_status": r.exit_status}
