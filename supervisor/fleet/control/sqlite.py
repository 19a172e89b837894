"""Control store in the queue's own SQLite file: one table laid out like the Azure one.

``control_records(part, row, kind, at, rev, doc)``: ``part``/``row`` are the partition and
row keys of base.py, ``at`` the record's own time (heartbeat or ``when``) for purges, ``doc``
the record's JSON text, and ``rev`` a change counter (``control_meta``) taken in the same
write transaction: a poll's cursor is the highest cancel ``rev`` it saw, and because writers
are serialised a later poll with ``rev > cursor`` misses nothing.

Threads: one instance per thread (its own connection).  Each write is one short
``BEGIN IMMEDIATE`` transaction; the busy timeout is short (default 1 s) so a queue under
load never holds a control call long, and a busy database raises ControlStoreError.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Union

from ...backends.sqlite.db import open_existing, read_only_may_help, use_wal
from . import base, records
from .base import ControlConfigError, ControlSnapshot, ControlStoreError, OnceLog, PurgeCounts

SCHEMA = """
CREATE TABLE IF NOT EXISTS control_records (
    part TEXT NOT NULL,
    row  TEXT NOT NULL,
    kind TEXT NOT NULL,
    at   REAL NOT NULL,
    rev  INTEGER NOT NULL,
    doc  TEXT NOT NULL,
    PRIMARY KEY (part, row)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS control_by_rev ON control_records (part, rev);
CREATE INDEX IF NOT EXISTS control_by_age ON control_records (kind, at);
CREATE TABLE IF NOT EXISTS control_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO control_meta (name, value) VALUES ('rev', 0);
"""

_UPSERT = ("INSERT INTO control_records (part, row, kind, at, rev, doc) VALUES (?,?,?,?,?,?) "
           "ON CONFLICT (part, row) DO UPDATE SET kind=excluded.kind, at=excluded.at, "
           "rev=excluded.rev, doc=excluded.doc")
_NEXT_REV = "UPDATE control_meta SET value=value+1 WHERE name='rev' RETURNING value"
_POLL = ("SELECT part, row, kind, rev, doc FROM control_records WHERE part=? AND ("
         "row='flag' OR (row>=? AND row<?) OR (row>='cancel:' AND row<'cancel;' AND rev>?))")


class SqliteControlStore:
    """Control records in ``path`` (normally the queue's database file)."""

    name = "sqlite"
    end_cursor = str(2**62)  # past every cancel's rev

    def __init__(self, path: str, busy_timeout: float = 1.0, create: bool = True) -> None:
        """``create=False`` (read-only jobq-ctl commands): where the file cannot be written
        (a read-only mount, a full disk), it is read as it is, or ControlStoreError."""
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ControlConfigError(f"control store: directory {parent} does not exist")
        self.path = path
        self._once = OnceLog()
        try:
            # isolation_level=None: explicit BEGIN IMMEDIATE, so a write never has to upgrade
            # a read lock (SQLite answers that with SQLITE_BUSY at once).
            self._conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None,
                                         check_same_thread=False)
        except sqlite3.Error as exc:
            raise ControlStoreError(f"control store {path}: cannot open: {exc}") from None
        try:
            self._conn.text_factory = lambda b: b.decode("utf-8", "replace")
            use_wal(self._conn, busy_timeout)
            # As the queue's own connections: no fsync per commit (WAL keeps the file
            # consistent; a power cut may lose the last records).  An fsync holds the write
            # lock for milliseconds, and the main loop's settlements wait for that lock.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(SCHEMA)
        except sqlite3.Error as exc:
            self._conn.close()
            if create or not read_only_may_help(exc):
                raise ControlStoreError(f"control store {path}: {exc}") from None
            self._conn = self._read_only(path, busy_timeout, exc)

    @staticmethod
    def _read_only(path: str, busy_timeout: float, first: sqlite3.Error) -> sqlite3.Connection:
        try:
            conn, found, _target = open_existing(path, busy_timeout, table="control_records")
        except sqlite3.Error:
            raise ControlStoreError(f"control store {path}: {first}") from None
        if not found:  # no worker wrote here yet: nothing to read
            conn.close()
            raise ControlStoreError(f"control store {path}: {first}")
        return conn

    def __repr__(self) -> str:
        return f"SqliteControlStore({self.path!r})"

    # ------------------------------------------------------------------------- plumbing
    @contextmanager
    def _tx(self, what: str, write: bool) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise ControlStoreError(f"control store {what}: {exc}") from None

    def _put(self, part: str, row: str, record: records.Record, at: float) -> None:
        with self._tx(f"write {record.kind}", write=True) as conn:
            (rev,) = conn.execute(_NEXT_REV).fetchone()
            conn.execute(_UPSERT, (part, row, record.kind, at, rev, records.encode(record)))

    def _delete(self, part: str, row: str) -> None:
        with self._tx("delete", write=True) as conn:
            conn.execute("DELETE FROM control_records WHERE part=? AND row=?", (part, row))

    def _decode(self, rows: Iterable[tuple[Any, ...]], kind: Union[str, None] = None
                ) -> Iterator[tuple[tuple[Any, ...], records.Record]]:
        """(row, record) for each row whose last column decodes; others skipped, logged once."""
        for row in rows:
            try:
                yield row, records.decode(row[-1], kind or row[-3])
            except records.RecordError as exc:
                base.skipped(self._once, self.name, (str(row[0]), str(row[1])), exc)

    def _select(self, what: str, sql: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        with self._tx(what, write=False) as conn:
            return conn.execute(sql, args).fetchall()

    # -------------------------------------------------------------------------- workers
    def put_worker(self, record: records.WorkerRecord) -> None:
        self._put(base.worker_partition(record.queue), base.key_part(record.id), record,
                  record.heartbeat)

    def delete_worker(self, queue: str, worker_id: str) -> None:
        self._delete(base.worker_partition(queue), base.key_part(worker_id))

    def workers(self, queue: Union[str, None] = None) -> list[records.WorkerRecord]:
        if queue is None:
            lo, hi = "w:", base.after_prefix("w:")
        else:
            lo = base.worker_partition(queue)
            hi = lo + "\x00"
        rows = self._select("list workers", "SELECT part, row, kind, rev, doc FROM "
                            "control_records WHERE part>=? AND part<? ORDER BY part, row",
                            (lo, hi))
        return [r for _, r in self._decode(rows, "worker")]  # type: ignore[misc]

    # ---------------------------------------------------------------------- ctl writes
    def put_cancel(self, cancel: records.Cancel) -> None:
        self._put(base.queue_partition(cancel.queue), base.row_of(cancel), cancel, cancel.when)

    def put_flag(self, flag: records.QueueFlag) -> None:
        self._put(base.queue_partition(flag.queue), "flag", flag, flag.when)

    def put_command(self, command: records.Command) -> None:
        self._put(base.queue_partition(command.queue), base.command_key(command), command,
                  command.when)

    # --------------------------------------------------------------------- worker reads
    def poll(self, queue: str, worker_id: str,
             cursor: Union[str, None] = None) -> ControlSnapshot:
        """One SELECT: the flag, cancels with a rev above ``cursor``, this worker's commands."""
        try:
            since = int(cursor) if cursor is not None else -1
        except ValueError:
            since = -1  # a cursor from another store: start over with all live cancels
        prefix = base.command_prefix(worker_id)
        rows = self._select("poll", _POLL,
                            (base.queue_partition(queue), prefix, base.after_prefix(prefix), since))
        return ControlSnapshot.of_rows(self._decode(rows), since, cursor)

    def get_cancel(self, queue: str, task_id: str) -> Union[records.Cancel, None]:
        rows = self._select("get cancel", "SELECT part, row, kind, rev, doc FROM "
                            "control_records WHERE part=? AND row=?",
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
        rows = self._select("list cancels", "SELECT part, row, kind, rev, doc FROM "
                            "control_records WHERE part=? AND row>='cancel:' AND "
                            "row<'cancel;' ORDER BY at", (base.queue_partition(queue),))
        return [r for _, r in self._decode(rows, "cancel")]  # type: ignore[misc]

    def put_result(self, result: records.ResultRecord) -> None:
        self.put_results([result])

    def put_results(self, batch: Sequence[records.ResultRecord]) -> None:
        """One transaction (one rev) for the whole batch: a short task's two records cost
        the queue's database one commit among many, not two of their own."""
        if not batch:
            return
        rows: list[tuple[str, str, str, float, str]] = []
        gone: list[tuple[str, str]] = []
        for r in batch:
            text = records.encode(r)
            rows.append((base.result_partition(r.queue), base.result_key(r), "result",
                         r.when, text))
            if r.outcome in base.INDEXED_STATES:
                rows.append((base.index_partition(r.queue), base.index_key(r.outcome, r),
                             base.INDEX_KIND, r.when, text))
            elif r.outcome == "lock-lost":  # a corrected record: no longer listed as ended
                gone += [(base.index_partition(r.queue), base.index_key(o, r))
                         for o in base.INDEXED_STATES]
        with self._tx("write results", write=True) as conn:
            (rev,) = conn.execute(_NEXT_REV).fetchone()
            conn.executemany(_UPSERT, [(p, k, kind, at, rev, doc) for p, k, kind, at, doc
                                       in rows])
            if gone:
                conn.executemany("DELETE FROM control_records WHERE part=? AND row=?", gone)

    def results(self, queue: str, outcome: Union[str, None] = None) -> list[records.ResultRecord]:
        if outcome in base.INDEXED_STATES:
            prefix = f"{outcome}:"
            rows = self._select("list results", "SELECT part, row, kind, rev, doc FROM "
                                "control_records WHERE part=? AND row>=? AND row<? ORDER BY at",
                                (base.index_partition(queue), prefix, base.after_prefix(prefix)))
        else:
            rows = self._select("list results", "SELECT part, row, kind, rev, doc FROM "
                                "control_records WHERE part=? ORDER BY at",
                                (base.result_partition(queue),))
        found: list[records.ResultRecord] = [
            r for _, r in self._decode(rows, "result")]  # type: ignore[misc]
        return [r for r in found if outcome is None or r.outcome == outcome]

    def put_audit(self, record: records.AuditRecord) -> None:
        self._put(base.audit_partition(record.queue), base.audit_key(record), record,
                  record.when)

    def audits(self, queue: str, limit: int = 100) -> list[records.AuditRecord]:
        rows = self._select("list actions", "SELECT part, row, kind, rev, doc FROM "
                            "control_records WHERE part=? ORDER BY row LIMIT ?",
                            (base.audit_partition(queue), max(0, limit)))
        return [r for _, r in self._decode(rows, "audit")]  # type: ignore[misc]

    def results_of(self, queue: str, task_id: str) -> list[records.ResultRecord]:
        prefix = base.key_part(task_id) + ":"
        rows = self._select("read results", "SELECT part, row, kind, rev, doc FROM "
                            "control_records WHERE part=? AND row>=? AND row<? ORDER BY row",
                            (base.result_partition(queue), prefix, base.after_prefix(prefix)))
        return [r for _, r in self._decode(rows, "result")]  # type: ignore[misc]

    def task_ids(self, queue: str, prefix: str, limit: int) -> list[str]:
        return base.task_ids_from_rows(self._first_row, queue, prefix, limit)

    def _first_row(self, part: str, lo: str, hi: str) -> Union[str, None]:
        rows = self._select("find task ids", "SELECT row FROM control_records WHERE part=? "
                            "AND row>=? AND row<? ORDER BY row LIMIT 1", (part, lo, hi))
        return str(rows[0][0]) if rows else None

    # --------------------------------------------------------------------- unique keys
    # A claim's doc is {"task": <task id>}, ``at`` its time; its ``rev`` is its etag.
    def create_claim(self, claim: base.UniqueClaim) -> bool:
        with self._tx("claim unique key", write=True) as conn:
            (rev,) = conn.execute(_NEXT_REV).fetchone()
            cur = conn.execute(
                "INSERT OR IGNORE INTO control_records (part, row, kind, at, rev, doc) "
                "VALUES (?,?,?,?,?,?)", (*_claim_key(claim.queue, claim.key), "unique",
                                         claim.when, rev, _claim_doc(claim)))
            return cur.rowcount == 1

    def get_claim(self, queue: str, key: str) -> Union[base.UniqueClaim, None]:
        rows = self._select("read unique key", "SELECT at, rev, doc FROM control_records "
                            "WHERE part=? AND row=?", _claim_key(queue, key))
        for at, rev, doc in rows:
            try:
                task_id = json.loads(doc)["task"]
            except (ValueError, KeyError, TypeError):
                task_id = ""  # unreadable: a claim of no task, which the next push replaces
            return base.UniqueClaim(queue, key, str(task_id), float(at), str(rev))
        return None

    def replace_claim(self, claim: base.UniqueClaim, etag: str) -> bool:
        with self._tx("replace unique key", write=True) as conn:
            (rev,) = conn.execute(_NEXT_REV).fetchone()
            cur = conn.execute(
                "UPDATE control_records SET at=?, rev=?, doc=? WHERE part=? AND row=? AND "
                "CAST(rev AS TEXT)=?", (claim.when, rev, _claim_doc(claim),
                                        *_claim_key(claim.queue, claim.key), etag))
            return cur.rowcount == 1

    def release_claim(self, queue: str, key: str, task_id: str) -> None:
        with self._tx("release unique key", write=True) as conn:
            conn.execute("DELETE FROM control_records WHERE part=? AND row=? AND "
                         "json_valid(doc) AND json_extract(doc, '$.task')=?",
                         (*_claim_key(queue, key), task_id))

    # -------------------------------------------------------------------- housekeeping
    def purge(self, now: float) -> PurgeCounts:
        """Delete records past their age (any process may; one short transaction)."""
        cut = base.purge_cutoffs(now)
        with self._tx("purge", write=True) as conn:
            # A cancel goes at its own ttl (``at`` is its ``when``); one without a ttl, or
            # whose document is not JSON (readers skip it anyway), at CANCEL_TTL.
            kinds = [k for (k,) in conn.execute(
                "DELETE FROM control_records WHERE (kind='worker' AND at<?) OR "
                "(kind='cancel' AND (at<? OR at + CASE WHEN json_valid(doc) THEN "
                "json_extract(doc, '$.ttl') END < ?)) OR (kind='cmd' AND at<?) OR "
                "(kind='result' AND at<?) OR (kind=? AND at<?) OR (kind='audit' AND at<?) OR "
                "(kind='unique' AND at<?) RETURNING kind",
                (cut["worker"], cut["cancel"], now, cut["cmd"], cut["result"],
                 base.INDEX_KIND, cut[base.INDEX_KIND], cut["audit"], cut["unique"]))]
        return PurgeCounts(workers=kinds.count("worker"), cancels=kinds.count("cancel"),
                           commands=kinds.count("cmd"), results=kinds.count("result"),
                           audits=kinds.count("audit"), claims=kinds.count("unique"))

    def close(self) -> None:
        self._conn.close()


def _claim_key(queue: str, key: str) -> tuple[str, str]:
    return base.claim_partition(queue), base.key_part(key)


def _claim_doc(claim: base.UniqueClaim) -> str:
    return json.dumps({"task": claim.task_id})
