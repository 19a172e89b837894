"""The output store of a PostgreSQL queue: tables in the queue's own schema.

Layout (backends/postgres/schema.py, ``_migration_output``): ``S.outputs`` has one row per
attempt -- ``size`` (where its output ends), ``run`` (which run of the attempt may write),
``complete`` and ``updated_at``; ``S.output_chunks`` holds the bytes, one row per chunk of at
most ``chunk_max`` bytes keyed by its byte position ``pos`` (the order and the read-by-offset
index in one).  An append is ONE statement: it moves ``size`` on only where ``run`` and
``size`` are what this writer expects, and inserts the chunks only when it did, then
``pg_notify``s ``"<S>.output"`` (payload ``queue/task_id/attempt``, delivered at commit).

Fencing: ``reopen`` (a run of an attempt released without counting) counts ``run`` up; a
writer of an earlier run -- a stopped worker still draining its buffers -- matches no row
from then on and stores nothing more (its bytes are dropped, one log line).  A retry of an
append whose answer was lost finds ``size`` already past its bytes and stores them once.  A
reader sees the header and the chunks of one snapshot: never a torn chunk.

Cost: an attempt's ``reopen`` one statement, each append one (several chunks in one), a
``finish`` one, a ``read`` one (two index look-ups), ``attempts`` one.

Retention (``purge``): the attempts whose ``updated_at`` is older than the cut-off, found by
its index, oldest first: each one's chunks in DELETEs of at most ``purge_batch`` rows (``FOR
UPDATE SKIP LOCKED``: two workers purging split the rows), then its header row; at most
``purge_max`` attempts or PURGE_BUDGET seconds per call, so the output-store thread is not
held up and no lock is held for long.

Push (``watch``, base.Watchable): jobq-ctl's followers (ops/follow.py) LISTEN on
``"<S>.output"`` (postgres_push.py); the control store's result records notify the same
channel (fleet/control/postgres.py), so an attempt's end is pushed too.  ``notify=False``: no
LISTEN, followers poll.

Threads: one instance per thread (the worker's output-store thread, a jobq-ctl command, a
dashboard request), each with one connection of its own (connect.py: never a backend pool),
made at the first call and again after it broke.  Every statement runs under a
``statement_timeout`` of ``timeout`` seconds and a client-side deadline (deadlines.py)
CUT_AFTER later;
failures are OutputStoreError, one redacted line.  Nothing is created here: the tables come
with the schema (``jobq-ctl migrate``, or a worker's start); readers find a schema without them
(an older version) empty.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from ...backends.base import BackendConfigError, BackendError
from ...backends.postgres.connect import APP_CTL, APP_WORKER, connect, describe, execute, failure
from ...backends.postgres.connect import psycopg as pg
from ...backends.postgres.deadlines import DEADLINES
from ...backends.postgres.schema import Tables, output_channel
from .base import READ_LIMIT, AttemptKey, Chunk, OutputConfigError, OutputStoreError
from .postgres_push import TaskListener, listen

log = logging.getLogger("jobq.output")

CHUNK_MAX = 1 << 20  # bytes per chunk row (an append of more is split)
STATEMENT_MAX = 4 << 20  # bytes per append statement
PURGE_BUDGET = 2.0  # s one purge call may take
CUT_AFTER = 2.0  # s past the statement_timeout before the client cuts the connection
_CACHED = 256  # attempts whose end this writer remembers


@dataclass
class _Tail:
    """What this writer knows of an attempt: its run and where its output ends."""

    run: int
    end: int
    fenced: bool = False  # a later run took over: this writer stores nothing more
    pending: Union[tuple[int, bytes], None] = None  # (start, bytes) of a call that raised


class PostgresOutputStore:
    """Output in schema ``schema`` of the database of ``url`` (a libpq string; None: the
    ``PG*`` variables).  ``create=False`` (readers) only reads.  ``prepare=False``: no
    prepared statements (PgBouncer); ``notify=False``: no NOTIFY (no listener can LISTEN)."""

    name = "postgres"

    def __init__(self, url: Union[str, None], schema: str, *, create: bool = True,
                 timeout: float = 10.0, prepare: bool = True, notify: bool = True,
                 chunk_max: int = CHUNK_MAX, purge_max: int = 1000,
                 purge_batch: int = 200) -> None:
        try:
            self.t = Tables.of(schema)
        except BackendConfigError as exc:
            raise OutputConfigError(f"output store: {exc}") from None
        self.url, self.schema, self.create = url, schema, create
        self.timeout, self.prepare, self.notify = timeout, prepare, notify
        self.chunk_max, self.purge_max, self.purge_batch = chunk_max, purge_max, purge_batch
        self.channel = output_channel(schema)
        self.where = f"schema {schema} on {describe(url)}"
        self._conn: Union[pg.Connection[Any], None] = None
        self._tails: dict[AttemptKey, _Tail] = {}
        self._watches: list[TaskListener] = []

    def __repr__(self) -> str:
        return f"PostgresOutputStore({self.where!r})"

    # ------------------------------------------------------------------------- plumbing
    def _connection(self) -> pg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = connect(self.url, application_name=APP_WORKER if self.create
                                     else APP_CTL, prepare=self.prepare)
            except (BackendError, BackendConfigError) as exc:
                raise OutputStoreError(f"output store: {exc}") from None
        return self._conn

    def _sql(self, what: str, sql: str, args: Union[Sequence[Any], dict[str, Any]],
             missing: Any = None) -> list[tuple[Any, ...]]:
        """One statement in a transaction of its own, within ``timeout`` seconds; its rows.
        A schema without the output tables gives ``missing`` to a reader."""
        conn = self._connection()
        try:
            # The server's statement_timeout answers first, keeping the connection; the cut
            # is for a server that answers nothing (frozen, black-holed).
            with DEADLINES.within(time.monotonic() + self.timeout + CUT_AFTER), \
                    DEADLINES.bounded(conn):
                return execute(conn, sql, args, timeout=self.timeout).fetchall()
        except pg.errors.UndefinedTable as exc:
            if not self.create and missing is not None:
                return list(missing)
            raise self._error(what, exc) from None
        except pg.Error as exc:
            if conn.broken or conn.closed:
                conn.close()
                self._conn = None
            raise self._error(what, exc) from None

    def _error(self, what: str, exc: BaseException) -> OutputStoreError:
        text = str(failure(exc, f"output store {what}", self.url))
        if isinstance(exc, pg.errors.InsufficientPrivilege):
            return OutputConfigError(text)  # never works: the shipper stops trying
        return OutputStoreError(text)

    def _key(self, key: AttemptKey) -> dict[str, Any]:
        return {"q": key.queue, "t": key.task_id, "a": key.attempt, "ch": self.channel,
                "p": f"{key.queue}/{key.task_id}/{key.attempt}"}

    def _notify(self, rows: str) -> str:
        """SQL that sends the notification once when ``rows`` (a CTE) has a row."""
        if not self.notify:
            return f"SELECT count(*) FROM {rows}"
        return (f"SELECT count(*), (SELECT pg_notify(%(ch)s, %(p)s) WHERE EXISTS "
                f"(SELECT FROM {rows})) FROM {rows}")

    # -------------------------------------------------------------------- writer state
    def _tail(self, key: AttemptKey) -> _Tail:
        """The attempt as this writer knows it; one that is new to it is adopted as it is
        (created when missing: an append or finish without reopen)."""
        tail = self._tails.get(key)
        if tail is None:
            if len(self._tails) >= _CACHED:
                self._tails.pop(next(iter(self._tails)))
            tail = self._tails[key] = self._load(key)
        return tail

    def _load(self, key: AttemptKey) -> _Tail:
        o = self.t.outputs
        rows = self._sql("open", (
            f"WITH ins AS (INSERT INTO {o} (queue, task_id, attempt) VALUES (%(q)s, %(t)s, "
            f"%(a)s) ON CONFLICT DO NOTHING RETURNING run, size) "
            f"SELECT run, size FROM ins UNION ALL SELECT run, size FROM {o} "
            f"WHERE queue=%(q)s AND task_id=%(t)s AND attempt=%(a)s"), self._key(key))
        if not rows:  # created by another writer after this statement's snapshot
            raise OutputStoreError("output store open: the attempt changed meanwhile; retried")
        return _Tail(int(rows[0][0]), int(rows[0][1]))

    def _fenced(self, key: AttemptKey, tail: _Tail) -> None:
        if not tail.fenced:
            log.warning("[%s] output store: attempt %d runs again elsewhere; this worker's "
                        "rest of its output is not stored", key.task_id, key.attempt)
        tail.fenced, tail.pending = True, None

    # -------------------------------------------------------------------------- writes
    def append(self, key: AttemptKey, data: bytes) -> None:
        """Output-store thread.  A retry of bytes that raised stores those that did not land;
        a writer fenced out by a later run stores nothing (and does not raise)."""
        if not data:
            return
        tail = self._tail(key)
        if tail.fenced:
            return
        start = tail.end
        retry = tail.pending is not None and tail.pending[1] == data
        if retry:
            start = tail.pending[0]  # type: ignore[index]
        tail.pending = (start, data)
        done = min(max(tail.end - start, 0), len(data))
        for _ in range(len(data) // STATEMENT_MAX + 4):
            if done >= len(data):
                tail.pending = None
                return
            group = data[done:done + STATEMENT_MAX]
            if self._put(key, tail.run, start + done, group):
                done += len(group)
                tail.end = start + done
                continue
            rows = self._sql("append", f"SELECT run, size FROM {self.t.outputs} WHERE "
                             "queue=%(q)s AND task_id=%(t)s AND attempt=%(a)s", self._key(key))
            if not rows:  # purged under a writer that was silent for the whole retention
                self._tails.pop(key, None)
                raise OutputStoreError("output store append: the attempt's output was purged")
            run, size = int(rows[0][0]), int(rows[0][1])
            if run != tail.run:
                self._fenced(key, tail)
                return
            tail.end = size
            if retry and start + done < size <= start + len(data):
                done = size - start  # those bytes landed (the answer was lost)
            else:  # not where this writer left it (bytes given up on may have landed, or
                # another instance wrote): the rest goes where the output ends
                start = size - done
                tail.pending = (start, data)
        raise OutputStoreError("output store append: the output keeps moving under this writer")

    def _put(self, key: AttemptKey, run: int, start: int, data: bytes) -> bool:
        """Chunks of ``data`` at ``start``, if the attempt's run and end are ``run`` and
        ``start``: whether they were stored."""
        pos = list(range(start, start + len(data), self.chunk_max))
        pieces = [data[p - start:p - start + self.chunk_max] for p in pos]
        o, c = self.t.outputs, self.t.output_chunks
        args = {**self._key(key), "run": run, "start": start, "n": len(data), "pos": pos,
                "data": pieces}
        rows = self._sql("append", (
            f"WITH h AS (UPDATE {o} SET size = size + %(n)s, updated_at = now() WHERE "
            f"queue=%(q)s AND task_id=%(t)s AND attempt=%(a)s AND run=%(run)s AND "
            f"size=%(start)s RETURNING 1), "
            f"c AS (INSERT INTO {c} (queue, task_id, attempt, pos, data) SELECT %(q)s, %(t)s, "
            f"%(a)s, u.pos, u.data FROM h, unnest(%(pos)s::bigint[], %(data)b::bytea[]) "
            f"AS u(pos, data) RETURNING 1) " + self._notify("c")), args)
        return bool(rows[0][0])

    def reopen(self, key: AttemptKey) -> int:
        """Output-store thread, before a run's first append: creates the attempt's row (one
        statement, the usual case), or takes the attempt over from earlier runs (``run`` + 1,
        not complete) and says where their output ends."""
        self._tails.pop(key, None)
        o = self.t.outputs
        rows = self._sql("reopen", (
            f"WITH ins AS (INSERT INTO {o} (queue, task_id, attempt) VALUES (%(q)s, %(t)s, "
            f"%(a)s) ON CONFLICT DO NOTHING RETURNING run, size), "
            f"up AS (UPDATE {o} SET run = run + 1, complete = false, updated_at = now() "
            f"WHERE queue=%(q)s AND task_id=%(t)s AND attempt=%(a)s AND NOT EXISTS "
            f"(SELECT FROM ins) RETURNING run, size) "
            f"SELECT run, size FROM ins UNION ALL SELECT run, size FROM up"), self._key(key))
        if not rows:
            raise OutputStoreError("output store reopen: the attempt changed meanwhile")
        tail = self._tails[key] = _Tail(int(rows[0][0]), int(rows[0][1]))
        return tail.end

    def finish(self, key: AttemptKey) -> None:
        """Output-store thread: ``complete``, unless a later run took the attempt over."""
        tail = self._tail(key)
        if tail.fenced:
            return
        rows = self._sql("finish", (
            f"WITH h AS (UPDATE {self.t.outputs} SET complete = true, updated_at = now() "
            f"WHERE queue=%(q)s AND task_id=%(t)s AND attempt=%(a)s AND run=%(run)s "
            f"RETURNING 1) " + self._notify("h")), {**self._key(key), "run": tail.run})
        if not rows[0][0]:
            self._tails.pop(key, None)
            reread = self._tail(key)
            if reread.run != tail.run:
                self._fenced(key, reread)
                return
            raise OutputStoreError("output store finish: the attempt changed meanwhile")
        self._tails.pop(key, None)

    # --------------------------------------------------------------------------- reads
    def read(self, key: AttemptKey, offset: int = 0, limit: int = READ_LIMIT) -> Chunk:
        o, c = self.t.outputs, self.t.output_chunks
        rows = self._sql("read", (
            f"SELECT o.size, o.complete, x.pos, x.part FROM {o} o LEFT JOIN LATERAL ("
            f"SELECT pos, substring(data FROM (greatest(%(off)s - pos, 0) + 1)::int "
            f"FOR (%(off)s + %(lim)s - greatest(pos, %(off)s))::int) AS part FROM {c} "
            f"WHERE queue=o.queue AND task_id=o.task_id AND attempt=o.attempt "
            f"AND pos >= coalesce((SELECT max(pos) FROM {c} WHERE queue=o.queue AND "
            f"task_id=o.task_id AND attempt=o.attempt AND pos <= %(off)s), 0) "
            f"AND pos < %(off)s + %(lim)s ORDER BY pos) x ON true "
            f"WHERE o.queue=%(q)s AND o.task_id=%(t)s AND o.attempt=%(a)s ORDER BY x.pos"),
            {**self._key(key), "off": offset, "lim": max(0, limit)}, missing=())
        if not rows:
            return Chunk(b"", offset, False)
        size, complete = int(rows[0][0]), bool(rows[0][1])
        parts = [(int(pos), bytes(part)) for _, _, pos, part in rows if part]
        if not parts:
            return Chunk(b"", offset, complete and offset >= size)
        # Each part starts at max(its chunk's pos, offset); a gap (a purge under way) is
        # skipped, never read as other bytes.
        at = max(parts[-1][0], offset) + len(parts[-1][1])
        return Chunk(b"".join(p for _, p in parts), at, complete and at >= size)

    def attempts(self, queue: str, task_id: str) -> list[int]:
        rows = self._sql("list", f"SELECT attempt FROM {self.t.outputs} WHERE queue=%s AND "
                         "task_id=%s ORDER BY attempt", (queue, task_id), missing=())
        return [int(a) for (a,) in rows]

    def task_ids(self, queue: str, prefix: str, limit: int) -> list[str]:
        rows = self._sql("find task ids", f"SELECT DISTINCT task_id FROM {self.t.outputs} WHERE "
                         "queue=%s AND starts_with(task_id, %s) ORDER BY task_id LIMIT %s",
                         (queue, prefix, limit), missing=())
        return [str(t) for (t,) in rows]

    # -------------------------------------------------------------------- housekeeping
    def purge(self, before: float) -> int:
        """Output-store thread: delete the attempts last written before ``before`` (epoch
        s), oldest first, in bounded statements; how many were deleted."""
        o, c = self.t.outputs, self.t.output_chunks
        stop = time.monotonic() + PURGE_BUDGET
        victims = self._sql("purge", f"SELECT queue, task_id, attempt FROM {o} WHERE "
                            "updated_at < to_timestamp(%s) ORDER BY updated_at LIMIT %s",
                            (before, self.purge_max), missing=())
        where = "queue=%(q)s AND task_id=%(t)s AND attempt=%(a)s"
        deleted = 0
        for queue, task_id, attempt in victims:
            args = {"q": queue, "t": task_id, "a": attempt, "n": self.purge_batch,
                    "before": before}
            while True:
                rows = self._sql("purge", (
                    f"WITH d AS (DELETE FROM {c} WHERE (queue, task_id, attempt, pos) IN "
                    f"(SELECT queue, task_id, attempt, pos FROM {c} WHERE {where} "
                    f"LIMIT %(n)s FOR UPDATE SKIP LOCKED) RETURNING 1) "
                    f"SELECT count(*) FROM d"), args)
                if int(rows[0][0]) < self.purge_batch or time.monotonic() >= stop:
                    break
            rows = self._sql("purge", (
                f"WITH d AS (DELETE FROM {o} WHERE {where} AND updated_at < "
                f"to_timestamp(%(before)s) AND NOT EXISTS (SELECT FROM {c} WHERE {where}) "
                f"RETURNING 1) SELECT count(*) FROM d"), args)
            deleted += int(rows[0][0])
            if time.monotonic() >= stop:
                break
        return deleted

    # ------------------------------------------------------------------------- push
    def watch(self, queue: str, task_ids: Sequence[str],
              on_change: Callable[[], None]) -> Union[TaskListener, None]:
        """LISTEN for writes to these tasks' output and results on a connection and thread
        of their own (module doc); None with ``notify=False`` (jobq-ctl's main thread)."""
        if not self.notify:
            return None
        watch = listen(self.url, self.channel, queue, task_ids, on_change)
        self._watches.append(watch)
        return watch

    def close(self) -> None:
        for watch in self._watches:
            watch.close()
        self._watches.clear()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
