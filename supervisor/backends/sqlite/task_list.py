"""The SQLite queue's task listing (``SqliteAdmin.list_tasks``; backends/task_list.py): newest
first by ``seq``, the next page after the last row's ``seq``.  The caller's thread.

A listing without a state walks the table's rowid backwards from the cursor and stops after a
page; one with a state reads that state's entries of ``jobs_by_priority`` (queue, status, ...)
and keeps the newest -- no new index, so receives and settlements cost what they did.
A row's ``created`` is the push, read as the smaller of ``created_at`` (a delayed task's is
when its delay ends: the oldest-pending age counts from there) and ``updated_at`` (the push,
until a worker takes it).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..task_list import BadCursor, TaskQuery, TaskRow, command_of, text_clause

# One state of TASK_STATES as a condition on a row (``?``: now, for pending vs delayed).
_STATE_SQL = {
    "pending": ("status='pending' AND visible_at <= ?", 1),
    "delayed": ("status='pending' AND visible_at > ?", 1),
    "running": ("status='running'", 0),
    "succeeded": ("status='succeeded'", 0),
    "failed": ("status='failed' AND coalesce(reason, '') NOT LIKE 'cancelled%'", 0),
    "cancelled": ("status='failed' AND reason LIKE 'cancelled%'", 0),
}
_SHOWN = ("CASE WHEN status='pending' AND visible_at > ? THEN 'delayed' "
          "WHEN status='failed' AND reason LIKE 'cancelled%' THEN 'cancelled' ELSE status END")


class Queue(Protocol):
    queue: str

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...


def list_tasks(backend: Queue, query: TaskQuery, now: float) -> list[TaskRow]:
    where: list[str] = ["queue=?"]
    args: list[object] = [backend.queue]
    if query.states:
        parts = []
        for state in query.states:
            sql, takes_now = _STATE_SQL[state]
            parts.append(f"({sql})")
            args += [now] * takes_now
        where.append("(" + " OR ".join(parts) + ")")
    if query.worker:
        where.append("locked_by=?")
        args.append(query.worker)
    if query.text:
        clause, patterns = text_clause(query.text, "body LIKE ? ESCAPE '\\'")
        where.append(clause)
        args += patterns
    if query.cursor:
        where.append("seq < ?")
        if not query.cursor.isdigit():
            raise BadCursor(query.cursor)
        args.append(int(query.cursor))
    rows = backend._query(
        f"SELECT seq, id, {_SHOWN}, attempt, max_attempts, body, min(created_at, updated_at), "
        "CASE WHEN status IN ('succeeded', 'failed') THEN updated_at END, locked_by, reason, "
        f"exit_status FROM jobs WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT ?",
        (now, *args, query.limit))
    return [TaskRow(id=i, state=state, attempt=attempt, max_attempts=most,
                    cmd=command_of(body), created=created, ended=ended, worker=worker,
                    reason=reason, exit_status=status, cursor=str(seq))
            for seq, i, state, attempt, most, body, created, ended, worker, reason, status
            in rows]
