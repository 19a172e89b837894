"""The control store on one SQL table of records, for every driver (``RecordTableStore``):
rows ``(part, row, kind, at, rev, doc)`` -- the partition and row keys of base.py, the
record's own time (heartbeat or ``when``) for purges, a change counter, the record's JSON text
as written (a signature covers it).  ``rev`` is a claim's etag and a poll's cursor (the
highest cancel ``rev`` seen; each driver makes cancels of a queue commit in ``rev`` order, so
a later poll with ``rev > cursor`` misses none).  Every statement is written here once but
for the driver's ``Dialect`` (sqlite.py, postgres.py), which also hands in its connection
handling (``_tx``, ``_exec``, ``_exec_many``).  One instance per thread (base.ControlStore).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, NamedTuple, TypeVar, Union

from . import base, records
from .base import ControlSnapshot, OnceLog, PurgeCounts
from .records import (
    AuditRecord,
    Cancel,
    Command,
    HistoryPoint,
    QueueFlag,
    ResultRecord,
    WorkerRecord,
)

Row = tuple[Any, ...]
C = TypeVar("C")  # a driver's connection
R = TypeVar("R", bound=records.Record)

PURGE_BUDGET = 10.0  # s: a batched purge stops after this many seconds (the next goes on)

# Written with %s for a parameter and {t}, {rev} for the table and a new rev (Dialect).
_COLUMNS = "part, row, kind, rev, doc"  # what _decode reads: row[-3] is the kind
_DELETE = "DELETE FROM {t} WHERE part = %s AND row = %s"
_POLL = ("part = %s AND (row = 'flag' OR (row >= %s AND row < %s) OR "
         "(row >= 'cancel:' AND row < 'cancel;' AND rev > %s))")
_CREATE_CLAIM = ("INSERT INTO {t} (part, row, kind, at, rev, doc) VALUES "
                 "(%s, %s, 'unique', %s, {rev}, %s) ON CONFLICT (part, row) DO NOTHING "
                 "RETURNING rev")
_GET_CLAIM = "SELECT at, rev, doc FROM {t} WHERE part = %s AND row = %s"
_REPLACE_CLAIM = ("UPDATE {t} SET at = %s, rev = {rev}, doc = %s WHERE part = %s AND "
                  "row = %s AND CAST(rev AS TEXT) = %s RETURNING rev")
# A claim's doc is {"task": <task id>}, ``at`` its time; its ``rev`` is its etag.


class Dialect(NamedTuple):
    """What one driver's SQL says differently (its statements in its own marker)."""

    table: str  # the records table as a statement names it
    marker: str  # a parameter: "?" or "%s"
    rev: str  # the SQL of a write's new rev
    bump: Union[str, None]  # run first in a write that takes a rev (SQLite's counter)
    upsert: str  # (part, row, kind, at, [expires,] doc), rev from ``rev``
    expires: bool  # the upsert takes a cancel's end (when + ttl) before ``doc``
    purge: str  # (cutoffs of purge_args, [batch]) -> RETURNING kind
    purge_batch: Union[int, None]  # rows per purge statement; None: all in one
    for_update: str  # what locks a row read before it is deleted ("" where a write locks all)


class RecordTableStore(Generic[C]):
    """base.ControlStore on the records table of ``dialect``; a driver subclasses it with
    its connection handling (``_tx``, ``_exec``, ``_exec_many``)."""

    name = "sql"
    end_cursor = str(2**62)  # past every cancel's rev

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._once = OnceLog()

    # ---------------------------------------------------------- the driver's connection
    def _tx(self, what: str, write: bool) -> AbstractContextManager[C]:
        """One transaction (``write``: it writes); errors -> ControlStoreError on ``what``."""
        raise NotImplementedError

    def _exec(self, conn: C, sql: str, args: Sequence[object] = ()) -> list[Row]:
        """One statement's rows ([] for a statement that returns none)."""
        raise NotImplementedError

    def _exec_many(self, conn: C, sql: str, rows: Sequence[Sequence[object]]) -> None:
        raise NotImplementedError

    def _on_put(self, conn: C, part: str, record: records.Record,
                notify: Union[str, None]) -> None:
        """What the driver adds to a record's write transaction, before the upsert
        (PostgreSQL: cancels in rev order, NOTIFY of ``notify``, the queue); nothing here."""

    def _on_results(self, conn: C, batch: Sequence[ResultRecord]) -> None:
        """What the driver adds to a result batch's transaction (PostgreSQL: a NOTIFY per
        attempt for jobq-ctl's followers); nothing here."""

    # ------------------------------------------------------------------------- plumbing
    def _sql(self, template: str) -> str:
        d = self.dialect
        return template.format(t=d.table, rev=d.rev).replace("%s", d.marker)

    def _put(self, part: str, row: str, record: records.Record, at: float,
             notify: Union[str, None] = None) -> None:
        """Upsert one record in one transaction; ``notify``: the queue whose workers want to
        know at once (a cancel, a flag, a command)."""
        expires = None
        if isinstance(record, Cancel) and record.ttl is not None:
            expires = record.when + record.ttl
        with self._tx(f"write {record.kind}", write=True) as conn:
            self._on_put(conn, part, record, notify)
            self._bump(conn)
            self._exec(conn, self.dialect.upsert,
                       self._upsert_args(part, row, record.kind, at, expires,
                                         records.encode(record)))

    def _upsert_args(self, part: str, row: str, kind: str, at: float,
                     expires: Union[float, None], doc: str) -> tuple[object, ...]:
        return (part, row, kind, at, *((expires,) if self.dialect.expires else ()), doc)

    def _bump(self, conn: C) -> None:
        if self.dialect.bump is not None:
            self._exec(conn, self.dialect.bump)

    def _delete(self, part: str, row: str) -> None:
        with self._tx("delete", write=True) as conn:
            self._exec(conn, self._sql(_DELETE), (part, row))

    def _select(self, what: str, where: str, args: Sequence[object]) -> list[Row]:
        with self._tx(what, write=False) as conn:
            return self._exec(conn, self._sql(f"SELECT {_COLUMNS} FROM {{t}} WHERE {where}"),
                              args)

    def _decode(self, rows: Iterable[Row], kind: Union[str, None] = None
                ) -> Iterator[tuple[Row, records.Record]]:
        """(row, record) for each row whose last column decodes; others skipped, logged once."""
        for row in rows:
            try:
                yield row, records.decode(row[-1], kind or row[-3])
            except records.RecordError as exc:
                base.skipped(self._once, self.name, (str(row[0]), str(row[1])), exc)

    def _records(self, what: str, cls: type[R], where: str, args: Sequence[object]) -> list[R]:
        """The records of ``cls`` the rows ``where`` selects hold (unreadable ones skipped)."""
        rows = self._select(what, where, args)
        return [r for _, r in self._decode(rows, cls.kind) if isinstance(r, cls)]

    # -------------------------------------------------------------------------- workers
    def put_worker(self, record: WorkerRecord) -> None:
        self._put(base.worker_partition(record.queue), base.key_part(record.id), record,
                  record.heartbeat)

    def delete_worker(self, queue: str, worker_id: str) -> None:
        self._delete(base.worker_partition(queue), base.key_part(worker_id))

    def workers(self, queue: Union[str, None] = None) -> list[WorkerRecord]:
        if queue is None:
            return self._records("list workers", WorkerRecord, "part >= %s AND part < %s ORDER "
                                 "BY part, row", ("w:", base.after_prefix("w:")))
        return self._records("list workers", WorkerRecord, "part = %s ORDER BY row",
                             (base.worker_partition(queue),))

    # ---------------------------------------------------------------------- ctl writes
    def put_cancel(self, cancel: Cancel) -> None:
        self._put(base.queue_partition(cancel.queue), base.row_of(cancel), cancel, cancel.when,
                  notify=cancel.queue)

    def put_flag(self, flag: QueueFlag) -> None:
        self._put(base.queue_partition(flag.queue), "flag", flag, flag.when, notify=flag.queue)

    def put_command(self, command: Command) -> None:
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
        rows = self._select("poll", _POLL, (base.queue_partition(queue), prefix,
                                            base.after_prefix(prefix), since))
        return ControlSnapshot.of_rows(self._decode(rows), since, cursor)

    def get_cancel(self, queue: str, task_id: str) -> Union[Cancel, None]:
        found = self._records("get cancel", Cancel, "part = %s AND row = %s",
                              (base.queue_partition(queue), base.cancel_key(task_id)))
        return found[0] if found else None

    def delete_cancel(self, queue: str, task_id: str) -> None:
        self._delete(base.queue_partition(queue), base.cancel_key(task_id))

    def ack_command(self, command: Command) -> None:
        self._delete(base.queue_partition(command.queue), base.command_key(command))

    # ------------------------------------------------------------------------ listings
    def cancels(self, queue: str) -> list[Cancel]:
        return self._records("list cancels", Cancel, "part = %s AND row >= 'cancel:' AND "
                             "row < 'cancel;' ORDER BY at, row", (base.queue_partition(queue),))

    def put_result(self, result: ResultRecord) -> None:
        self.put_results([result])

    def put_results(self, batch: Sequence[ResultRecord]) -> None:
        """One transaction for the whole batch (executemany: PostgreSQL pipelines it): the
        control thread's flush of many short tasks is one commit."""
        if not batch:
            return
        rows: list[tuple[object, ...]] = []
        gone: list[tuple[str, str]] = []
        for r in batch:
            text = records.encode(r)
            rows.append(self._upsert_args(base.result_partition(r.queue), base.result_key(r),
                                          "result", r.when, None, text))
            if r.outcome in base.INDEXED_STATES:
                rows.append(self._upsert_args(base.index_partition(r.queue),
                                              base.index_key(r.outcome, r), base.INDEX_KIND,
                                              r.when, None, text))
            elif r.outcome == "lock-lost":  # a corrected record: no longer listed as ended
                gone += [(base.index_partition(r.queue), base.index_key(o, r))
                         for o in base.INDEXED_STATES]
        with self._tx("write results", write=True) as conn:
            self._bump(conn)
            self._exec_many(conn, self.dialect.upsert, rows)
            if gone:
                self._exec_many(conn, self._sql(_DELETE), gone)
            self._on_results(conn, batch)

    def results(self, queue: str, outcome: Union[str, None] = None) -> list[ResultRecord]:
        if outcome in base.INDEXED_STATES:
            prefix = f"{outcome}:"
            found = self._records("list results", ResultRecord, "part = %s AND row >= %s AND "
                                  "row < %s ORDER BY at, row", (base.index_partition(queue),
                                                                prefix, base.after_prefix(prefix)))
        else:
            found = self._records("list results", ResultRecord, "part = %s ORDER BY at, row",
                                  (base.result_partition(queue),))
        return [r for r in found if outcome is None or r.outcome == outcome]

    def put_audit(self, record: AuditRecord) -> None:
        self._put(base.audit_partition(record.queue), base.audit_key(record), record,
                  record.when)

    def audits(self, queue: str, limit: int = 100) -> list[AuditRecord]:
        return self._records("list actions", AuditRecord, "part = %s ORDER BY row LIMIT %s",
                             (base.audit_partition(queue), max(0, limit)))

    def put_history(self, point: HistoryPoint) -> None:
        self._put(base.history_partition(point.queue), base.history_key(point.minute), point,
                  point.minute)

    def history(self, queue: str, since: float) -> list[HistoryPoint]:
        return self._records("read history", HistoryPoint, "part = %s AND row >= %s ORDER BY "
                             "row", (base.history_partition(queue), base.history_key(since)))

    def results_of(self, queue: str, task_id: str) -> list[ResultRecord]:
        prefix = base.key_part(task_id) + ":"
        return self._records("read results", ResultRecord, "part = %s AND row >= %s AND "
                             "row < %s ORDER BY row", (base.result_partition(queue), prefix,
                                                       base.after_prefix(prefix)))

    def task_ids(self, queue: str, prefix: str, limit: int) -> list[str]:
        return base.task_ids_from_rows(self._first_row, queue, prefix, limit)

    def _first_row(self, part: str, lo: str, hi: str) -> Union[str, None]:
        # part and row compare byte by byte (PostgreSQL: COLLATE "C"): a key range
        rows = self._select("find task ids", "part = %s AND row >= %s AND row < %s ORDER BY "
                            "row LIMIT 1", (part, lo, hi))
        return str(rows[0][1]) if rows else None

    # --------------------------------------------------------------------- unique keys
    def create_claim(self, claim: base.UniqueClaim) -> bool:
        with self._tx("claim unique key", write=True) as conn:
            self._bump(conn)
            return bool(self._exec(conn, self._sql(_CREATE_CLAIM), (
                *_claim_key(claim.queue, claim.key), claim.when,
                json.dumps({"task": claim.task_id}))))

    def get_claim(self, queue: str, key: str) -> Union[base.UniqueClaim, None]:
        with self._tx("read unique key", write=False) as conn:
            rows = self._exec(conn, self._sql(_GET_CLAIM), _claim_key(queue, key))
        for at, rev, doc in rows:
            return base.UniqueClaim(queue, key, _claim_task(doc), float(at), str(rev))
        return None

    def replace_claim(self, claim: base.UniqueClaim, etag: str) -> bool:
        with self._tx("replace unique key", write=True) as conn:
            self._bump(conn)
            return bool(self._exec(conn, self._sql(_REPLACE_CLAIM), (
                claim.when, json.dumps({"task": claim.task_id}),
                *_claim_key(claim.queue, claim.key), etag)))

    def release_claim(self, queue: str, key: str, task_id: str) -> None:
        """The row is locked while its document is read, so that a push replacing the
        claim meanwhile keeps it."""
        part, row = _claim_key(queue, key)
        with self._tx("release unique key", write=True) as conn:
            found = self._exec(conn, self._sql(_GET_CLAIM) + self.dialect.for_update,
                               (part, row))
            if found and _claim_task(found[0][2]) == task_id:
                self._exec(conn, self._sql(_DELETE), (part, row))

    # -------------------------------------------------------------------- housekeeping
    def purge(self, now: float) -> PurgeCounts:
        """Delete records past their age (any process may): all at once, or ``purge_batch``
        rows per transaction for at most PURGE_BUDGET s (the next purge goes on)."""
        cut, d = base.purge_cutoffs(now), self.dialect
        args = (cut["worker"], cut["cancel"], now, cut["cmd"], cut["result"], base.INDEX_KIND,
                cut[base.INDEX_KIND], cut["audit"], cut["unique"],
                cut["history"], *(() if d.purge_batch is None else (d.purge_batch,)))
        kinds: list[str] = []
        stop = time.monotonic() + PURGE_BUDGET
        while True:
            with self._tx("purge", write=True) as conn:
                batch = [str(k) for (k,) in self._exec(conn, d.purge, args)]
            kinds += batch
            if (d.purge_batch is None or len(batch) < d.purge_batch
                    or time.monotonic() >= stop):
                break
        return PurgeCounts(workers=kinds.count("worker"), cancels=kinds.count("cancel"),
                           commands=kinds.count("cmd"), results=kinds.count("result"),
                           audits=kinds.count("audit"), claims=kinds.count("unique"),
                           history=kinds.count("history"))


def _claim_key(queue: str, key: str) -> tuple[str, str]:
    return base.claim_partition(queue), base.key_part(key)


def _claim_task(doc: str) -> str:
    """The task a claim's document names; "" when unreadable (a claim of no task, which
    the next push replaces)."""
    try:
        return str(json.loads(doc)["task"])
    except (ValueError, KeyError, TypeError):
        return ""
