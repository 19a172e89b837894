"""Control store in the queue's own PostgreSQL database: the records of base.py in one table.

``S.control_records(part, row, kind, at, rev, expires, doc)`` (backends/postgres/schema.py,
migration ``_migration_control``), laid out as the SQLite store's table: ``part``/``row`` the
partition and row keys of base.py (byte order: ``COLLATE "C"``), ``at`` the record's own time
for purges, ``doc`` the record's JSON text as written (a signature covers that text),
``expires`` a cancel's own end (``when + ttl``).  ``rev`` is taken from the sequence
``S.control_rev``: the etag of a unique-key claim, and the poll's cursor (the highest cancel
``rev`` seen).  Sequence values are handed out in one order and committed in another, so each
cancel write takes a transaction-level advisory lock of its queue first: cancels of a queue
commit in ``rev`` order, and a later poll with ``rev > cursor`` misses none.

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
so the store works through PgBouncer in transaction mode (``prepare=False``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, Union

from ...backends.base import BackendConfigError, BackendError, QueueNotFound
from ...backends.postgres.connect import connect, describe, one_line, psycopg
from ...backends.postgres.connect import statement_timeout_ms as timeout_ms
from ...backends.postgres.deadlines import DEADLINES
from ...backends.postgres.listener import WakeListener
from ...backends.postgres.schema import Tables, check_schema, control_channel, output_channel
from . import base, records
from .base import (
    ControlConfigError,
    ControlSnapshot,
    ControlStoreError,
    ControlStoreRefused,
    OnceLog,
    PurgeCounts,
)

APP_CONTROL = "jobq-control"  # application_name: pg_stat_activity tells them from the data plane
CALL_TIMEOUT = 5.0  # s: a call's statement_timeout
CUT_GRACE = 1.0  # s after it that a call the server does not answer is cut (deadlines.py)
PURGE_BATCH = 1000  # rows per purge statement
PURGE_BUDGET = 10.0  # s: a purge stops after this many seconds of batches (the next goes on)
LISTEN_EFFECT = "cancels, pauses and commands arrive at the next poll meanwhile"

_COLUMNS = "part, row, kind, rev, doc"  # what _decode reads: row[-3] is the kind
_UPSERT = ("INSERT INTO {t} (part, row, kind, at, rev, expires, doc) VALUES "
           "(%s, %s, %s, %s, nextval('{rev}'), %s, %s) ON CONFLICT (part, row) DO UPDATE SET "
           "kind = EXCLUDED.kind, at = EXCLUDED.at, rev = EXCLUDED.rev, "
           "expires = EXCLUDED.expires, doc = EXCLUDED.doc")
_POLL = ("SELECT {c} FROM {t} WHERE part = %s AND (row = 'flag' OR (row >= %s AND row < %s) "
         "OR (row >= 'cancel:' AND row < 'cancel;' AND rev > %s))")
_PURGE = ("DELETE FROM {t} WHERE (part, row) IN (SELECT part, row FROM {t} WHERE "
          "(kind = 'worker' AND at < %s) OR (kind = 'cancel' AND (at < %s OR expires < %s)) OR "
          "(kind = 'cmd' AND at < %s) OR (kind = 'result' AND at < %s) OR "
          "(kind = %s AND at < %s) OR (kind = 'audit' AND at < %s) OR "
          "(kind = 'unique' AND at < %s) LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING kind")


class PostgresControlStore:
    """Control records in schema ``schema`` of the database at ``url``."""

    name = "postgres"
    end_cursor = str(2**62)  # past every cancel's rev

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
        self.url, self.schema, self.timeout = url, schema, timeout
        self._table, self._rev = tables.control_records, tables.control_rev
        self._channel = control_channel(schema)
        self._outputs = output_channel(schema)  # result records: jobq-ctl's followers
        self._prepare = prepare
        self._notify = notify
        self._watches: list[_QueueWatch] = []
        self._trace = trace
        self._once = OnceLog()
        self._lock = threading.Lock()
        self._conn: Union[psycopg.Connection[Any], None] = None
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
    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = connect(self.url, application_name=APP_CONTROL,
                                     prepare=self._prepare)
            except (BackendError, BackendConfigError) as exc:
                raise ControlStoreError(f"control store: {exc}") from None
        return self._conn

    @contextmanager
    def _tx(self, what: str) -> Iterator[psycopg.Connection[Any]]:
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
                else:
                    detail = one_line(exc, self.url)
                error = (ControlStoreRefused if isinstance(
                    exc, psycopg.errors.InsufficientPrivilege) else ControlStoreError)
                raise error(f"control store {what}: {detail}") from None

    def _traced(self, text: str) -> None:
        if self._trace is not None:
            self._trace(text)

    def _exec(self, conn: psycopg.Connection[Any], sql: str,
              args: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        self._traced(f"{sql} {tuple(args)!r}")
        return conn.execute(sql, args)

    def _sql(self, template: str) -> str:
        return template.format(t=self._table, rev=self._rev, c=_COLUMNS)

    def _put(self, part: str, row: str, record: records.Record, at: float,
             notify: Union[str, None] = None) -> None:
        """Upsert one record; ``notify``: the queue to NOTIFY on control_channel, in the
        same transaction."""
        expires = None
        if isinstance(record, records.Cancel) and record.ttl is not None:
            expires = record.when + record.ttl
        with self._tx(f"write {record.kind}") as conn:
            if isinstance(record, records.Cancel):
                # Cancels of a queue commit in rev order (the poll's cursor; module doc).
                self._exec(conn, "SELECT pg_advisory_xact_lock(%s)", (self._cancel_lock(part),))
            self._exec(conn, self._sql(_UPSERT),
                       (part, row, record.kind, at, expires, records.encode(record)))
            if notify is not None:
                self._exec(conn, "SELECT pg_notify(%s, %s)", (self._channel, notify))

    def _cancel_lock(self, part: str) -> int:
        digest = hashlib.sha256(f"jobq-supervisor control {self.schema} {part}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def _delete(self, part: str, row: str) -> None:
        with self._tx("delete") as conn:
            self._exec(conn, self._sql("DELETE FROM {t} WHERE part = %s AND row = %s"),
                       (part, row))

    def _select(self, what: str, where: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._tx(what) as conn:
            return self._exec(conn, self._sql(f"SELECT {{c}} FROM {{t}} WHERE {where}"),
                              args).fetchall()

    def _decode(self, rows: Iterable[tuple[Any, ...]], kind: Union[str, None] = None
                ) -> Iterator[tuple[tuple[Any, ...], records.Record]]:
        """(row, record) for each row whose last column decodes; others skipped, logged once."""
        for row in rows:
            try:
                yield row, records.decode(row[-1], kind or row[-3])
            except records.RecordError as exc:
                base.skipped(self._once, self.name, (str(row[0]), str(row[1])), exc)

    # -------------------------------------------------------------------------- workers
    def put_worker(self, record: records.WorkerRecord) -> None:
        self._put(base.worker_partition(record.queue), base.key_part(record.id), record,
                  record.heartbeat)

    def delete_worker(self, queue: str, worker_id: str) -> None:
        self._delete(base.worker_partition(queue), base.key_part(worker_id))

    def workers(self, queue: Union[str, None] = None) -> list[records.WorkerRecord]:
        if queue is None:
            rows = self._select("list workers", "part >= %s AND part < %s ORDER BY part, row",
                                ("w:", base.after_prefix("w:")))
        else:
            rows = self._select("list workers", "part = %s ORDER BY row",
                                (base.worker_partition(queue),))
        return [r for _, r in self._decode(rows, "worker")]  # type: ignore[misc]

    # ---------------------------------------------------------------------- ctl writes
    def put_cancel(self, cancel: records.Cancel) -> None:
        self._put(base.queue_partition(cancel.queue), base.row_of(cancel), cancel, cancel.when,
                  notify=cancel.queue)

    def put_flag(self, flag: records.QueueFlag) -> None:
        self._put(base.queue_partition(flag.queue), "flag", flag, flag.when, notify=flag.queue)

    def put_command(self, command: records.Command) -> None:
        self._put(base.queue_partition(command.queue), base.command_key(command), command,
                  command.when, notify=command.queue)

    # --------------------------------------------------------------------- worker reads
    def poll(self, queue: str, worker_id: str,
             cursor: Union[str, None] = None) -> ControlSnapshot:
        """One SELECT: the flag, cancels with a rev above ``cursor``, this worker's commands."""
        try:
            since = int(cursor) if cursor is not None else -1
        except ValueError:
            since = -1  # a cursor from another store: start over with all live cancels
        prefix = base.command_prefix(worker_id)
        with self._tx("poll") as conn:
            rows = self._exec(conn, self._sql(_POLL), (
                base.queue_partition(queue), prefix, base.after_prefix(prefix),
                since)).fetchall()
        return ControlSnapshot.of_rows(self._decode(rows), since, cursor)

    def get_cancel(self, queue: str, task_id: str) -> Union[records.Cancel, None]:
        rows = self._select("get cancel", "part = %s AND row = %s",
                            (base.queue_partition(queue), base.cancel_key(task_id)))
        for _, record in self._decode(rows, "cancel"):
            return record  # type: ignore[return-value]
        return None

    def delete_cancel(self, queue: str, task_id: str) -> None:
        self._delete(base.queue_partition(queue), base.cancel_key(task_id))

    def ack_command(self, command: records.Command) -> None:
        self._delete(base.queue_partition(command.queue), base.command_key(command))

    # ------------------------------------------------------------------------ listings
    def cancels(self, queue: str) -> list[records.Cancel]:
        rows = self._select("list cancels", "part = %s AND row >= 'cancel:' AND "
                            "row < 'cancel;' ORDER BY at, row", (base.queue_partition(queue),))
        return [r for _, r in self._decode(rows, "cancel")]  # type: ignore[misc]

    def put_result(self, result: records.ResultRecord) -> None:
        self.put_results([result])

    def put_results(self, batch: Sequence[records.ResultRecord]) -> None:
        """One transaction for the whole batch, its statements sent together (executemany
        pipelines them): the control thread's flush of many short tasks is one round trip.
        Each attempt's record is NOTIFYed on ``"<S>.output"`` (unless ``notify=False``):
        ``push --wait`` and ``logs -f`` learn of an end at once."""
        if not batch:
            return
        rows: list[tuple[str, str, str, float, None, str]] = []
        gone: list[tuple[str, str]] = []
        for r in batch:
            text = records.encode(r)
            rows.append((base.result_partition(r.queue), base.result_key(r), "result",
                         r.when, None, text))
            if r.outcome in base.INDEXED_STATES:
                rows.append((base.index_partition(r.queue), base.index_key(r.outcome, r),
                             base.INDEX_KIND, r.when, None, text))
            elif r.outcome == "lock-lost":  # a corrected record: no longer listed as ended
                gone += [(base.index_partition(r.queue), base.index_key(o, r))
                         for o in base.INDEXED_STATES]
        with self._tx("write results") as conn:
            with conn.cursor() as cur:
                self._traced(f"{self._sql(_UPSERT)} x {len(rows)}")
                cur.executemany(self._sql(_UPSERT), rows)
                if gone:
                    self._traced(f"DELETE x {len(gone)}")
                    cur.executemany(self._sql("DELETE FROM {t} WHERE part = %s AND row = %s"),
                                    gone)
                if self._notify:  # jobq-ctl's followers (fleet/output/postgres_push.py)
                    ends = list(dict.fromkeys(f"{r.queue}/{r.task_id}/{r.attempt}"
                                              for r in batch))
                    self._traced(f"NOTIFY x {len(ends)}")
                    cur.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p",
                                (self._outputs, ends))

    def results(self, queue: str, outcome: Union[str, None] = None) -> list[records.ResultRecord]:
        if outcome in base.INDEXED_STATES:
            prefix = f"{outcome}:"
            rows = self._select("list results", "part = %s AND row >= %s AND row < %s "
                                "ORDER BY at, row", (base.index_partition(queue), prefix,
                                                     base.after_prefix(prefix)))
        else:
            rows = self._select("list results", "part = %s ORDER BY at, row",
                                (base.result_partition(queue),))
        found: list[records.ResultRecord] = [
            r for _, r in self._decode(rows, "result")]  # type: ignore[misc]
        return [r for r in found if outcome is None or r.outcome == outcome]

    def put_audit(self, record: records.AuditRecord) -> None:
        self._put(base.audit_partition(record.queue), base.audit_key(record), record,
                  record.when)

    def audits(self, queue: str, limit: int = 100) -> list[records.AuditRecord]:
        rows = self._select("list actions", "part = %s ORDER BY row LIMIT %s",
                            (base.audit_partition(queue), max(0, limit)))
        return [r for _, r in self._decode(rows, "audit")]  # type: ignore[misc]

    def results_of(self, queue: str, task_id: str) -> list[records.ResultRecord]:
        prefix = base.key_part(task_id) + ":"
        rows = self._select("read results", "part = %s AND row >= %s AND row < %s "
                            "ORDER BY row", (base.result_partition(queue), prefix,
                                             base.after_prefix(prefix)))
        return [r for _, r in self._decode(rows, "result")]  # type: ignore[misc]

    # --------------------------------------------------------------------- unique keys
    # A claim's doc is {"task": <task id>}, ``at`` its time; its ``rev`` is its etag.
    def create_claim(self, claim: base.UniqueClaim) -> bool:
        with self._tx("claim unique key") as conn:
            return bool(self._exec(conn, self._sql(
                "INSERT INTO {t} (part, row, kind, at, rev, doc) VALUES "
                "(%s, %s, 'unique', %s, nextval('{rev}'), %s) ON CONFLICT (part, row) "
                "DO NOTHING RETURNING rev"), (*_claim_key(claim.queue, claim.key), claim.when,
                                              _claim_doc(claim))).fetchall())

    def get_claim(self, queue: str, key: str) -> Union[base.UniqueClaim, None]:
        with self._tx("read unique key") as conn:
            rows = self._exec(conn, self._sql("SELECT at, rev, doc FROM {t} WHERE part = %s "
                                              "AND row = %s"), _claim_key(queue, key)).fetchall()
        for at, rev, doc in rows:
            return base.UniqueClaim(queue, key, _claim_task(doc), float(at), str(rev))
        return None

    def replace_claim(self, claim: base.UniqueClaim, etag: str) -> bool:
        with self._tx("replace unique key") as conn:
            return bool(self._exec(conn, self._sql(
                "UPDATE {t} SET at = %s, rev = nextval('{rev}'), doc = %s WHERE part = %s "
                "AND row = %s AND rev::text = %s RETURNING rev"),
                (claim.when, _claim_doc(claim), *_claim_key(claim.queue, claim.key),
                 etag)).fetchall())

    def release_claim(self, queue: str, key: str, task_id: str) -> None:
        """The row is locked while its document is read, so that a push replacing the
        claim meanwhile keeps it."""
        part, row = _claim_key(queue, key)
        with self._tx("release unique key") as conn:
            found = self._exec(conn, self._sql("SELECT rev, doc FROM {t} WHERE part = %s AND "
                                               "row = %s FOR UPDATE"), (part, row)).fetchall()
            if found and _claim_task(found[0][1]) == task_id:
                self._exec(conn, self._sql("DELETE FROM {t} WHERE part = %s AND row = %s"),
                           (part, row))

    # -------------------------------------------------------------------- housekeeping
    def purge(self, now: float) -> PurgeCounts:
        """Delete records past their age (any process may), PURGE_BATCH rows per short
        transaction (``SKIP LOCKED``: two purges at once split the rows), for at most
        PURGE_BUDGET seconds; the next purge deletes what is left."""
        cut = base.purge_cutoffs(now)
        args = (cut["worker"], cut["cancel"], now, cut["cmd"], cut["result"], base.INDEX_KIND,
                cut[base.INDEX_KIND], cut["audit"], cut["unique"], PURGE_BATCH)
        kinds: list[str] = []
        stop = time.monotonic() + PURGE_BUDGET
        while True:
            with self._tx("purge") as conn:
                batch = [k for (k,) in self._exec(conn, self._sql(_PURGE), args).fetchall()]
            kinds += batch
            if len(batch) < PURGE_BATCH or time.monotonic() >= stop:
                break
        return PurgeCounts(workers=kinds.count("worker"), cancels=kinds.count("cancel"),
                           commands=kinds.count("cmd"), results=kinds.count("result"),
                           audits=kinds.count("audit"), claims=kinds.count("unique"))

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


def _claim_key(queue: str, key: str) -> tuple[str, str]:
    return base.claim_partition(queue), base.key_part(key)


def _claim_doc(claim: base.UniqueClaim) -> str:
    return json.dumps({"task": claim.task_id})


def _claim_task(doc: str) -> str:
    """The task a claim's document names; "" when unreadable (a claim of no task, which
    the next push replaces)."""
    try:
        return str(json.loads(doc)["task"])
    except (ValueError, KeyError, TypeError):
        return ""
