"""The lease of the SQLite backend: one running job, fenced by its token.

Made on the main thread by SqliteBackend.receive; renewed and settled by its LeaseKeeper
thread through the backend's shared lease connection (sqlite.py), or by the main thread inside
``quick_writes``.  Every write is ``... WHERE seq=? AND token=? AND status='running'``: a lease
that was reaped and handed out again can never write.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol

from ...core.task import Task
from ..base import LeaseLost
from ..common import parse_body


class Writer(Protocol):
    """What a lease uses of SqliteBackend (which hands itself in: no import of it here)."""

    queue: str
    settle_timeout: float  # s a settlement's write may wait for the database

    def lease_write(self, sql: str, args: tuple, timeout: float) -> int:
        """One fenced UPDATE on the shared lease connection; the rows it changed."""
        ...


class SqliteLease:
    """A running job held by this worker.  Used from its LeaseKeeper thread only."""

    def __init__(self, backend: Writer, row: tuple[int, str, str, int, int, int | None],
                 lock_duration: float) -> None:
        """``row``: what RECEIVE_SQL returns for one job (sqlite.py)."""
        self._backend = backend
        self.queue = backend.queue
        self.lock_duration = lock_duration
        seq, self.message_id, self.raw_body, self.attempt, self._token, max_attempts = row
        self._fence = (seq, self._token)  # appended to every write's arguments
        if isinstance(self.raw_body, bytes):  # a BLOB (pushed as bytes by another tool):
            # read as text like every other column (db.connect), so it parses, or is
            # dead-lettered as poison with the same hint
            self.raw_body = self.raw_body.decode("utf-8", "replace")
        self.format_error: str | None
        task, self.format_error = parse_body(self.raw_body)
        if task is not None and max_attempts is not None and task.max_attempts is None:
            task = replace(task, max_attempts=max_attempts)  # the column set at push
        self.task: Task | None = task

    def _write(self, sql: str, args: tuple, timeout: float) -> None:
        """One fenced UPDATE.  Raises LeaseLost when the token no longer matches (the lease
        was reaped, perhaps handed out again), BackendError on a busy database."""
        n = self._backend.lease_write(sql, args + self._fence, timeout)
        if n == 0:
            raise LeaseLost(f"job {self.message_id}: lease token {self._token} no longer valid")

    def renew(self, timeout: float) -> float:
        now = time.time()
        self._write(
            "UPDATE jobs SET locked_until=?, updated_at=? "
            "WHERE seq=? AND token=? AND status='running'",
            (now + self.lock_duration, now), timeout)
        return self.lock_duration

    # A finished job keeps locked_by as "the worker that ran it last"; a released one not.
    def complete(self) -> None:
        now = time.time()
        self._settle("status='succeeded', exit_status=0, reason=NULL", (), now)

    def release(self, count_attempt: bool, delay: float = 0.0) -> None:
        now = time.time()
        if count_attempt:
            self._settle("status='pending', locked_by=NULL, visible_at=?", (now + delay,), now)
        else:
            self._settle("status='pending', locked_by=NULL, visible_at=?, "
                         "attempt=MAX(attempt - 1, 0), preemptions=preemptions + 1",
                         (now + delay,), now)

    def dead_letter(self, reason: str, output_tail: str, exit_status: int | None = None) -> None:
        now = time.time()
        self._settle("status='failed', reason=?, output_tail=?, exit_status=?",
                     (reason, output_tail, exit_status), now)

    def _settle(self, assignments: str, args: tuple, now: float) -> None:
        self._write(
            f"UPDATE jobs SET {assignments}, locked_until=NULL, updated_at=? "
            "WHERE seq=? AND token=? AND status='running'",
            args + (now,), self._backend.settle_timeout)
