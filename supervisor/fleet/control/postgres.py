"""Control store in the queue's own PostgreSQL database: record_table.py's table of records,
with this driver's SQL and connection handling.

``S.control_records(part, row, kind, at, rev, expires, doc)`` (backends/postgres/schema.py,
migration ``_migration_control``), laid out as the SQLite store's table (record_table.py;
keys in byte order: ``COLLATE "C"``), plus ``expires``, a cancel's own end (``when + ttl``),
for the purge.  ``rev`` is taken from the sequence ``S.control_rev``.  Sequence values are
handed out in one order and committed in another, so each cancel write takes a
transaction-level advisory lock of its queue first: cancels of a queue commit in ``rev``
order, and a later poll with ``rev > cursor`` misses none.

A cancel, a queue flag and a command each send ``NOTIFY "S.control"`` (``control_channel``)
with the queue's name, in the write's transaction: a listening worker learns of it at once.
Result records send ``NOTIFY "S.output"`` (``output_channel``) with ``queue/task_id/attempt``
instead: only jobq-ctl's followers LISTEN there (fleet/output/postgres_push.py), no worker.
``watch`` (the worker's control thread, base.Watchable) LISTENs: one connection and thread
of its own (backends/postgres/listener.py's ``WakeListener``, with its reconnection,
re-LISTEN and deadlines), never the store's call connection nor the backend's; a
notification of the queue makes the control thread poll at once (fleet/agent.py).  While the
listener is down the worker just polls every control interval; ``notify=False``
(``--postgres-notify off``, PgBouncer in transaction mode) listens never.

Connections: one per instance (base.ControlStore: one instance per thread -- the worker's
control thread, one jobq-ctl command, one dashboard request thread), made by
backends/postgres/connect.py (conninfo defaults, redaction) and never one of the backend's
pools, so that a slow control query never holds a receive, a renewal or a settlement.  A
pool would add threads per instance for one caller; a lock guards the connection anyway.  A
broken connection is dropped and made again at the next call.  Every call is one short
transaction under ``SET LOCAL statement_timeout`` (``timeout``) and a client-side deadline
(backends/postgres/deadlines.py: a frozen server cannot hold the control thread); any failure
is ControlStoreError, one redacted line.  Nothing uses session state beyond a transaction,
so the store works through PgBouncer in transaction mode (``prepare=False``).  The purge
deletes PURGE_BATCH rows per short transaction (``SKIP LOCKED``: two purges at once split the
rows), for at most record_table.PURGE_BUDGET seconds.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Callable, Union

from ...backends.base import BackendConfigError, BackendError, QueueNotFound
from ...backends.postgres.connect import (
    POOLER_HINT,
    Conn,
    connect,
    describe,
    lost_prepared_statement,
    one_line,
    psycopg,
)
from ...backends.postgres.connect import statement_timeout_ms as timeout_ms
from ...backends.postgres.deadlines import DEADLINES
from ...backends.postgres.listener import WakeListener
from ...backends.postgres.schema import Tables, check_schema, control_channel, output_channel
from . import records
from .base import ControlConfigError, ControlStoreError, ControlStoreRefused
from .record_table import Dialect, RecordTableStore, Row

APP_CONTROL = "jobq-control"  # application_name: pg_stat_activity tells them from the data plane
CALL_TIMEOUT = 5.0  # s: a call's statement_timeout
CUT_GRACE = 1.0  # s after it that a call the server does not answer is cut (deadlines.py)
PURGE_BATCH = 1000  # rows per purge statement
LISTEN_EFFECT = "cancels, pauses and commands arrive at the next poll meanwhile"

_UPSERT = ("INSERT INTO {t} (part, row, kind, at, rev, expires, doc) VALUES "
           "(%s, %s, %s, %s, nextval('{rev}'), %s, %s) ON CONFLICT (part, row) DO UPDATE SET "
           "kind = EXCLUDED.kind, at = EXCLUDED.at, rev = EXCLUDED.rev, "
           "expires = EXCLUDED.expires, doc = EXCLUDED.doc")
_PURGE = ("DELETE FROM {t} WHERE (part, row) IN (SELECT part, row FROM {t} WHERE "
          "(kind = 'worker' AND at < %s) OR (kind = 'cancel' AND (at < %s OR expires < %s)) OR "
          "(kind = 'cmd' AND at < %s) OR (kind = 'result' AND at < %s) OR "
          "(kind = %s AND at < %s) OR (kind = 'audit' AND at < %s) OR "
          "(kind = 'unique' AND at < %s) OR (kind = 'history' AND at < %s) "
          "LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING kind")


def dialect(tables: Tables) -> Dialect:
    """The statements on the records table and rev sequence of ``tables``."""
    t, rev = tables.control_records, tables.control_rev
    return Dialect(table=t, marker="%s", rev=f"nextval('{rev}')", bump=None,
                   upsert=_UPSERT.format(t=t, rev=rev), expires=True,
                   purge=_PURGE.format(t=t), purge_batch=PURGE_BATCH, for_update=" FOR UPDATE")


class PostgresControlStore(RecordTableStore[Conn]):
    """Control records in schema ``schema`` of the database at ``url``."""

    name = "postgres"

    def __init__(self, url: Union[str, None], schema: str = "jobq", *, create: bool = True,
                 prepare: bool = True, notify: bool = True, timeout: float = CALL_TIMEOUT,
                 trace: Union[Callable[[str], None], None] = None) -> None:
        """Connect and check the schema (the caller's thread).  ``create``: a schema that is
        missing or older is migrated when the role may (backends/postgres/schema.py);
        ``create=False`` (read-only jobq-ctl commands) creates nothing and such a schema is
        ControlStoreError.  ``prepare=False``: no prepared statements (PgBouncer in
        transaction mode); ``notify=False``: ``watch`` gives None (no LISTEN).  ``trace``:
        called with each statement (tests count them)."""
        try:
            tables = Tables.of(schema)
        except BackendConfigError as exc:
            raise ControlConfigError(f"control store: {exc}") from None
        super().__init__(dialect(tables))
        self.url, self.schema, self.timeout = url, schema, timeout
        self._channel = control_channel(schema)
        self._outputs = output_channel(schema)  # result records: jobq-ctl's followers
        self._prepare = prepare
        self._notify = notify
        self._watches: list[_QueueWatch] = []
        self._trace = trace
        self._lock = threading.Lock()
        self._conn: Union[Conn, None] = None
        conn = self._connection()
        try:
            check_schema(conn, schema, create, url)
        except QueueNotFound as exc:
            self.close()
            raise ControlStoreError(f"control store: {exc}") from None
        except BackendConfigError as exc:
            self.close()
            raise ControlConfigError(f"control store: {exc}") from None
        except BackendError as exc:
            self.close()
            raise ControlStoreError(f"control store: {exc}") from None

    def __repr__(self) -> str:
        return f"PostgresControlStore(schema {self.schema} on {describe(self.url)})"

    # ------------------------------------------------------------------------- plumbing
    def _connection(self) -> Conn:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = connect(self.url, application_name=APP_CONTROL,
                                     prepare=self._prepare)
            except (BackendError, BackendConfigError) as exc:
                raise ControlStoreError(f"control store: {exc}") from None
        return self._conn

    @contextmanager
    def _tx(self, what: str, write: bool) -> Iterator[Conn]:
        """One transaction under the call's timeouts; errors -> ControlStoreError."""
        with self._lock:
            try:
                conn = self._connection()
                deadline = time.monotonic() + self.timeout + CUT_GRACE
                with DEADLINES.within(deadline), DEADLINES.bounded(conn), conn.transaction():
                    conn.execute("SELECT set_config('statement_timeout', %s, true)",
                                 (f"{timeout_ms(self.timeout)}ms",))
                    self._traced("BEGIN")
                    yield conn
                self._traced("COMMIT")
            except (psycopg.Error, UnicodeError) as exc:
                if self._conn is not None and (self._conn.broken or self._conn.closed):
                    self._conn.close()
                    self._conn = None  # made again at the next call
                if isinstance(exc, psycopg.errors.QueryCanceled):
                    detail = "timed out (statement_timeout)"
                elif lost_prepared_statement(exc):  # as the backend says it (connect.failure)
                    detail = f"{one_line(exc, self.url)}; {POOLER_HINT}"
                else:
                    detail = one_line(exc, self.url)
                error = (ControlStoreRefused if isinstance(
                    exc, psycopg.errors.InsufficientPrivilege) else ControlStoreError)
                raise error(f"control store {what}: {detail}") from None

    def _traced(self, text: str) -> None:
        if self._trace is not None:
            self._trace(text)

    def _exec(self, conn: Conn, sql: str, args: Sequence[object] = ()) -> list[Row]:
        self._traced(f"{sql} {tuple(args)!r}")
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description is not None else []

    def _exec_many(self, conn: Conn, sql: str, rows: Sequence[Sequence[object]]) -> None:
        """The statements pipelined (executemany): one round trip for a batch."""
        self._traced(f"{sql} x {len(rows)}")
        with conn.cursor() as cur:
            cur.executemany(sql, rows)

    def _on_put(self, conn: Conn, part: str, record: records.Record,
                notify: Union[str, None]) -> None:
        """Cancels of a queue commit in rev order (the poll's cursor; module doc), and
        ``notify`` is sent on control_channel in the write's transaction."""
        if isinstance(record, records.Cancel):
            self._exec(conn, "SELECT pg_advisory_xact_lock(%s)", (self._cancel_lock(part),))
        if notify is not None:
            self._exec(conn, "SELECT pg_notify(%s, %s)", (self._channel, notify))

    def _on_results(self, conn: Conn, batch: Sequence[records.ResultRecord]) -> None:
        """Each attempt's record NOTIFYed on ``"<S>.output"`` (unless ``notify=False``):
        ``push --wait`` and ``logs -f`` learn of an end at once (fleet/output/postgres_push.py);
        no worker LISTENs there."""
        if self._notify:
            ends = list(dict.fromkeys(f"{r.queue}/{r.task_id}/{r.attempt}" for r in batch))
            self._exec(conn, "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p",
                       (self._outputs, ends))

    def _cancel_lock(self, part: str) -> int:
        digest = hashlib.sha256(f"jobq-supervisor control {self.schema} {part}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    # ------------------------------------------------------------------------ push
    def watch(self, queue: str, on_change: Callable[[], None]) -> Union[_QueueWatch, None]:
        """LISTEN for writes to ``queue``'s control records on a connection and thread of
        their own (module doc); None with ``notify=False`` (the worker's control thread)."""
        if not self._notify:
            return None
        url = self.url
        listener = WakeListener(
            lambda: connect(url, application_name=APP_CONTROL), self._channel,
            describe=lambda exc: one_line(exc, url), name="control store listener",
            effect=LISTEN_EFFECT, thread_name="pg-control-listener")
        listener.watch(queue)
        listener.wake = on_change
        listener.start()
        watch = _QueueWatch(listener, queue)
        self._watches.append(watch)
        return watch

    def close(self) -> None:
        """Close the connection and end every watch (the owning thread; idempotent)."""
        for watch in self._watches:
            watch.close()
        self._watches.clear()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class _QueueWatch:
    """base.Watch over one queue's WakeListener (the control thread)."""

    def __init__(self, listener: WakeListener, queue: str) -> None:
        self.listener = listener
        self.queue = queue

    def changed(self) -> bool:
        return self.listener.changed(self.queue)

    def close(self) -> None:
        self.listener.close()
