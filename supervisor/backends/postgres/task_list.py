"""The PostgreSQL queue's task listing (``PostgresAdmin.list_tasks``; backends/task_list.py):
newest first by (created_at, id), the next page after the last row's pair (the tasks of one
push share its transaction's ``now()``: they list among themselves in id order).  The
caller's thread, on the main pool.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

from ..task_list import BadCursor, TaskQuery, TaskRow, command_of, text_clause

_STATE_SQL = {
    "pending": "state='pending' AND run_at <= now()",
    "delayed": "state='pending' AND run_at > now()",
    "running": "state='running'",
    "succeeded": "state='succeeded'",
    "failed": "state='failed' AND coalesce(reason, '') NOT LIKE 'cancelled%%'",
    "cancelled": "state='failed' AND reason LIKE 'cancelled%%'",
}
_SHOWN = ("CASE WHEN state='pending' AND run_at > now() THEN 'delayed' "
          "WHEN state='failed' AND reason LIKE 'cancelled%%' THEN 'cancelled' ELSE state END")
_SEP = "|"  # between the cursor's time and id: a timestamp's text has none
# ``created_at::text`` as the server writes it (DateStyle ISO): a cursor's first part
_CREATED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?[+-]\d\d(:\d\d){0,2}")


class Queue(Protocol):
    queue: str
    jobs: str

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]: ...


def list_tasks(backend: Queue, query: TaskQuery) -> list[TaskRow]:
    where: list[str] = ["queue=%s"]
    args: list[object] = [backend.queue]
    if query.states:
        where.append("(" + " OR ".join(f"({_STATE_SQL[s]})" for s in query.states) + ")")
    if query.worker:
        where.append("worker=%s")  # set at receive: running it, or the one that ended it
        args.append(query.worker)
    if query.text:
        clause, patterns = text_clause(query.text, "body ILIKE %s")
        where.append(clause)
        args += patterns
    if query.cursor:
        at, sep, last = query.cursor.partition(_SEP)
        if not (sep and last and _CREATED.fullmatch(at)):
            raise BadCursor(query.cursor)
        where.append("(created_at, id) < (%s::timestamptz, %s)")
        args += [at, last]
    rows = backend._query(
        f"SELECT id, {_SHOWN}, attempt, body, EXTRACT(EPOCH FROM created_at), "
        "EXTRACT(EPOCH FROM ended_at), worker, reason, exit_status, "
        f"created_at::text FROM {backend.jobs} WHERE {' AND '.join(where)} "
        "ORDER BY created_at DESC, id DESC LIMIT %s", (*args, query.limit))
    return [TaskRow(id=i, state=state, attempt=attempt, max_attempts=None, cmd=command_of(body),
                    created=float(created), ended=None if ended is None else float(ended),
                    worker=worker, reason=reason, exit_status=status, cursor=at + _SEP + i)
            for i, state, attempt, body, created, ended, worker, reason, status, at in rows]
