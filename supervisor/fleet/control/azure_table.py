"""Control store in Azure Table Storage (azure-data-tables): one table, keys as in base.py.

Entity: ``PartitionKey``, ``RowKey``, ``kind`` (str), ``at`` (double: heartbeat or
``when``, for purges), ``n`` (int) and ``d0`` .. ``d<n-1>``: the record's JSON text cut into
properties of at most records.CHUNK code points (64 KiB per string property; 1 MiB per
entity, which records.fit_worker keeps a worker record under).

Cost of an idle worker (5 s control interval, 15 s heartbeat): one upsert per heartbeat
(240/h) + one query per poll (720/h) + an hourly purge query (1/h, plus one delete per purged
record) = ~961 calls/hour.  The poll's cursor is the service's ``Timestamp`` of the newest
cancel seen; the next poll asks for cancels from ``cursor - CURSOR_SLACK`` on, because two
writes in flight may become visible out of timestamp order -- so a cancel may be returned by
the polls of the next few seconds again (readers keep what they acted on).

Threads: one instance per thread (SDK clients are not documented thread-safe).  No SDK
retries and explicit connect/read timeouts: a dead store raises ControlStoreError within
``connect_timeout``/``read_timeout`` instead of retrying for a minute.  ``create=False``
(read-only jobq-ctl commands): a table no worker made yet reads as no records.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, TypeVar, Union

from azure.core.exceptions import (
    AzureError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, UpdateMode

from ...backends.azure_common import Scrubber
from ...core.azure_account import create_if_missing, error_code, sdk_client, store_error
from .azure_claims import AzureClaims
from .base import (
    INDEX_KIND,
    INDEXED_STATES,
    ControlConfigError,
    ControlSnapshot,
    ControlStoreError,
    OnceLog,
    PurgeCounts,
    after_prefix,
    audit_key,
    audit_partition,
    cancel_key,
    command_key,
    command_prefix,
    history_key,
    history_partition,
    index_key,
    index_partition,
    key_part,
    purge_cutoffs,
    queue_partition,
    result_key,
    result_partition,
    row_of,
    skipped,
    task_ids_from_rows,
    worker_partition,
)
from .records import (
    AuditRecord,
    Cancel,
    Command,
    HistoryPoint,
    QueueFlag,
    Record,
    RecordError,
    ResultRecord,
    WorkerRecord,
    chunks,
    decode,
    encode,
)

log = logging.getLogger("jobq.control")
T = TypeVar("T")
DEFAULT_TABLE = "jobqcontrol"
CURSOR_SLACK = 10.0  # s
# A call of a black-holed store fails after connect (3 s) or read (6 s) timeout: jobq-ctl
# then exits within 10 s, process start included.
READ_TIMEOUT = 6.0
TRANSACTION_MAX = 100  # entities in one batch transaction (the service's limit)


class AzureTableControlStore(AzureClaims):
    """Control records in table ``table`` of one storage account.

    Exactly one of ``connection_string`` (with ``TableEndpoint=`` or an account name) or
    ``account_url`` (the table endpoint; credential: ``credential``, a SAS in the URL or
    DefaultAzureCredential).  ``request_hook`` sees every HTTP request (tests count them)."""

    name = "azure-table"
    end_cursor = "9999-12-31T00:00:00+00:00"  # past every cancel's Timestamp

    def __init__(self, *, connection_string: Union[str, None] = None,
                 account_url: Union[str, None] = None, credential: Any = None,
                 table: str = DEFAULT_TABLE, connect_timeout: float = 3.0,
                 read_timeout: float = READ_TIMEOUT, create: bool = True,
                 cursor_slack: float = CURSOR_SLACK,
                 request_hook: Union[Callable[[Any], None], None] = None) -> None:
        if bool(connection_string) == bool(account_url):
            raise ControlConfigError(
                "control store: needs exactly one of a connection string or an account URL")
        self.scrub = Scrubber(connection_string, account_url)
        self._once = OnceLog()
        self._slack = timedelta(seconds=cursor_slack)
        hook = {} if request_hook is None else {"raw_request_hook": request_hook}
        try:
            self._client: TableClient = sdk_client(
                TableClient, connection_string=connection_string, account_url=account_url,
                credential=credential, connect_timeout=connect_timeout,
                read_timeout=read_timeout, sas_as_credential=True, table_name=table, **hook)
        except (ValueError, TypeError) as exc:
            raise ControlConfigError(
                f"control store: bad connection string or account URL: "
                f"{self.scrub(str(exc))}") from None
        self.endpoint = self.scrub(self._client.url.split("?", 1)[0])
        self.create = create
        # The table is made by a call that finds it missing, not here: a worker's first poll
        # is then one round trip (not two) before its first receive, on every run but the
        # first on a new account.  Every time it is found missing, not only the first: a
        # table deleted under running workers (an in-memory Azurite restarted, an operator's
        # delete) comes back with their next call.

    def __repr__(self) -> str:
        return f"AzureTableControlStore({self.endpoint!r}, table={self._client.table_name!r})"

    # ------------------------------------------------------------------------- plumbing
    def _create(self) -> None:
        create_if_missing(self._client.create_table, store="control store", kind="table",
                          name=self._client.table_name, errors=(AzureError,),
                          fail=self._error, log=log)

    def _error(self, what: str, exc: BaseException) -> ControlStoreError:
        first = (str(exc).splitlines() or [""])[0][:300]
        return store_error(exc, f"control store {what}",
                           self.scrub(f"{type(exc).__name__}: {first}"),
                           ControlConfigError, ControlStoreError)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn``'s answer; a missing table is made (``create``) and ``fn`` tried once more."""
        for last in (False, True):
            try:
                return fn()
            except (AzureError, OSError, ValueError) as exc:
                if last or not self.create or not table_missing(exc):
                    raise self._error(what, exc) from None
            self._create()
        raise AssertionError("unreachable")  # pragma: no cover

    def _put(self, part: str, row: str, record: Record, at: float) -> None:
        entity = _entity(part, row, record, at)
        # REPLACE, not MERGE: a shorter record must not keep the old record's extra chunks.
        self._call(f"write {record.kind}",
                   lambda: self._client.upsert_entity(entity, mode=UpdateMode.REPLACE))

    def _delete(self, what: str, part: str, row: str) -> None:
        """Deleting what is gone already is fine (the SDK ignores a 404)."""
        self._call(what, lambda: self._client.delete_entity(part, row))

    def _query(self, what: str, query: str, params: dict[str, Any],
               select: Union[list[str], None] = None,
               page: Union[int, None] = None) -> list[Any]:
        """Every match, or with ``page`` only the first ``page`` in key order (one call)."""
        def query_() -> list[Any]:
            try:
                if page is not None:
                    return list(next(self._client.query_entities(
                        query, parameters=params, select=select,
                        results_per_page=min(page, 1000)).by_page(), []))
                return list(self._client.query_entities(query, parameters=params,
                                                        select=select))
            except ResourceNotFoundError:
                if self.create:
                    raise
                return []  # jobq-ctl before any worker made the table: no records yet
        return self._call(what, query_)

    def _decode(self, entity: Any, kind: Union[str, None] = None) -> Union[Record, None]:
        where = (str(entity.get("PartitionKey")), str(entity.get("RowKey")))
        try:
            n = entity.get("n")
            if not isinstance(n, int) or not 0 < n <= 64:
                raise RecordError(f"bad chunk count {n!r}")
            text = "".join(_str(entity.get(f"d{i}")) for i in range(n))
            return decode(text, kind or entity.get("kind"))
        except RecordError as exc:
            skipped(self._once, self.name, where, exc)
            return None

    def _records(self, entities: list[Any], kind: str) -> list[Any]:
        return [r for r in (self._decode(e, kind) for e in entities) if r is not None]

    # -------------------------------------------------------------------------- workers
    def put_worker(self, record: WorkerRecord) -> None:
        self._put(worker_partition(record.queue), key_part(record.id), record,
                  record.heartbeat)

    def delete_worker(self, queue: str, worker_id: str) -> None:
        self._delete("delete worker", worker_partition(queue), key_part(worker_id))

    def workers(self, queue: Union[str, None] = None) -> list[WorkerRecord]:
        if queue is None:
            found = self._query("list workers", "PartitionKey ge @lo and PartitionKey lt @hi",
                                {"lo": "w:", "hi": after_prefix("w:")})
        else:
            found = self._query("list workers", "PartitionKey eq @pk",
                                {"pk": worker_partition(queue)})
        return self._records(found, "worker")

    # ---------------------------------------------------------------------- ctl writes
    def put_cancel(self, cancel: Cancel) -> None:
        self._put(queue_partition(cancel.queue), row_of(cancel), cancel, cancel.when)

    def put_flag(self, flag: QueueFlag) -> None:
        self._put(queue_partition(flag.queue), "flag", flag, flag.when)

    def put_command(self, command: Command) -> None:
        self._put(queue_partition(command.queue), command_key(command), command, command.when)

    # --------------------------------------------------------------------- worker reads
    def poll(self, queue: str, worker_id: str,
             cursor: Union[str, None] = None) -> ControlSnapshot:
        """One query (one HTTP call unless more than 1,000 rows match)."""
        prefix = command_prefix(worker_id)
        params: dict[str, Any] = {"pk": queue_partition(queue), "c0": prefix,
                                  "c1": after_prefix(prefix)}
        since = _parse_cursor(cursor)
        cancel_clause = "( RowKey ge 'cancel:' and RowKey lt 'cancel;' )"
        if since is not None:
            params["since"] = since - self._slack
            cancel_clause = ("( RowKey ge 'cancel:' and RowKey lt 'cancel;' and "
                             "Timestamp ge @since )")
        # The SDK substitutes @names only in words delimited by spaces.
        query = ("PartitionKey eq @pk and ( RowKey eq 'flag' or "
                 f"( RowKey ge @c0 and RowKey lt @c1 ) or {cancel_clause} )")
        flag = None
        cancels: list[Cancel] = []
        commands: list[Command] = []
        top = since
        for entity in self._query("poll", query, params):
            record = self._decode(entity)
            if isinstance(record, QueueFlag):
                flag = record
            elif isinstance(record, Cancel):
                cancels.append(record)
                stamp = entity.metadata.get("timestamp")
                if isinstance(stamp, datetime) and (top is None or stamp > top):
                    top = stamp
            elif isinstance(record, Command):
                commands.append(record)
        commands.sort(key=lambda c: c.seq)
        return ControlSnapshot(flag, tuple(cancels), tuple(commands),
                               top.isoformat() if top is not None else cursor)

    def get_cancel(self, queue: str, task_id: str) -> Union[Cancel, None]:
        """One point lookup (a claim checks its task)."""
        found = self._query("get cancel", "PartitionKey eq @pk and RowKey eq @rk",
                            {"pk": queue_partition(queue), "rk": cancel_key(task_id)})
        records = self._records(found, "cancel")
        return records[0] if records else None

    def delete_cancel(self, queue: str, task_id: str) -> None:
        self._delete("delete cancel", queue_partition(queue), cancel_key(task_id))

    def ack_command(self, command: Command) -> None:
        self._delete("delete command", queue_partition(command.queue), command_key(command))

    # ------------------------------------------------------------------------ listings
    def cancels(self, queue: str) -> list[Cancel]:
        found = self._query("list cancels", "PartitionKey eq @pk and RowKey ge @lo and "
                            "RowKey lt @hi", {"pk": queue_partition(queue), "lo": "cancel:",
                                              "hi": "cancel;"})
        return sorted(self._records(found, "cancel"), key=lambda c: c.when)

    def put_result(self, result: ResultRecord) -> None:
        self.put_results([result])

    def put_results(self, batch: Sequence[ResultRecord]) -> None:
        """One batch transaction per partition and TRANSACTION_MAX entities (a transaction
        spans one partition); a key seen twice keeps its last record (a batch may not name an
        entity twice)."""
        parts: dict[str, dict[str, dict[str, Any]]] = {}
        gone: list[tuple[str, str]] = []
        for r in batch:
            parts.setdefault(result_partition(r.queue), {})[result_key(r)] = _entity(
                result_partition(r.queue), result_key(r), r, r.when)
            if r.outcome in INDEXED_STATES:
                part, row = index_partition(r.queue), index_key(r.outcome, r)
                parts.setdefault(part, {})[row] = _entity(part, row, r, r.when, INDEX_KIND)
            elif r.outcome == "lock-lost":  # a corrected record: no longer listed as ended
                gone += [(index_partition(r.queue), index_key(o, r)) for o in INDEXED_STATES]
        for entities in parts.values():
            ops = [("upsert", e, {"mode": UpdateMode.REPLACE}) for e in entities.values()]
            for i in range(0, len(ops), TRANSACTION_MAX):
                chunk = ops[i:i + TRANSACTION_MAX]
                self._call("write results",
                           lambda c=chunk: self._client.submit_transaction(c))  # type: ignore[misc]
        for part, row in gone:  # rare; in a transaction a missing entity would fail it all
            self._delete("write results", part, row)

    def results(self, queue: str, outcome: Union[str, None] = None) -> list[ResultRecord]:
        if outcome in INDEXED_STATES:
            found = self._query("list results", "PartitionKey eq @pk and RowKey ge @lo and "
                                "RowKey lt @hi", {"pk": index_partition(queue),
                                                  "lo": f"{outcome}:",
                                                  "hi": after_prefix(f"{outcome}:")})
        else:
            found = self._query("list results", "PartitionKey eq @pk",
                                {"pk": result_partition(queue)})
        records: list[ResultRecord] = self._records(found, "result")
        return sorted((r for r in records if outcome is None or r.outcome == outcome),
                      key=lambda r: r.when)

    def put_audit(self, record: AuditRecord) -> None:
        self._put(audit_partition(record.queue), audit_key(record), record, record.when)

    def audits(self, queue: str, limit: int = 100) -> list[AuditRecord]:
        found = self._query("list actions", "PartitionKey eq @pk",
                            {"pk": audit_partition(queue)}, page=limit) if limit > 0 else []
        return self._records(found, "audit")[:limit]

    def put_history(self, point: HistoryPoint) -> None:
        self._put(history_partition(point.queue), history_key(point.minute), point,
                  point.minute)

    def history(self, queue: str, since: float) -> list[HistoryPoint]:
        found = self._query("read history", "PartitionKey eq @pk and RowKey ge @lo",
                            {"pk": history_partition(queue), "lo": history_key(since)})
        return sorted(self._records(found, "history"), key=lambda p: p.minute)

    def results_of(self, queue: str, task_id: str) -> list[ResultRecord]:
        prefix = key_part(task_id) + ":"
        found = self._query("read results", "PartitionKey eq @pk and RowKey ge @lo and "
                            "RowKey lt @hi", {"pk": result_partition(queue), "lo": prefix,
                                              "hi": after_prefix(prefix)})
        return sorted(self._records(found, "result"), key=lambda r: r.attempt)

    def task_ids(self, queue: str, prefix: str, limit: int) -> list[str]:
        return task_ids_from_rows(self._first_row, queue, prefix, limit)

    def _first_row(self, part: str, lo: str, hi: str) -> Union[str, None]:
        found = self._query("find task ids", "PartitionKey eq @pk and RowKey ge @lo and "
                            "RowKey lt @hi", {"pk": part, "lo": lo, "hi": hi},
                            select=["RowKey"], page=1)
        return str(found[0]["RowKey"]) if found else None

    # -------------------------------------------------------------------- housekeeping
    def purge(self, now: float) -> PurgeCounts:
        """One query over the table plus one delete per expired record."""
        cut = purge_cutoffs(now)
        # A cancel with a ttl of its own carries ``expires``; without one, CANCEL_TTL.
        query = " or ".join([*(f"( kind eq '{k}' and at lt @{k} )" for k in cut),
                             "( kind eq 'cancel' and expires lt @now )"])
        counts = {k: 0 for k in cut}
        for entity in self._query("purge", query, {**cut, "now": float(now)},
                                  select=["PartitionKey", "RowKey", "kind"]):
            self._delete("purge", entity["PartitionKey"], entity["RowKey"])
            counts[entity["kind"]] += 1
        return PurgeCounts(workers=counts["worker"], cancels=counts["cancel"],
                           commands=counts["cmd"], results=counts["result"],
                           audits=counts["audit"], claims=counts["unique"],
                           history=counts["history"])

    def close(self) -> None:
        self._client.close()


def table_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the table does not exist, in any of the forms the SDK reports
    it: a ResourceNotFoundError with code TableNotFound (an insert's error carries the code
    only in its text), or a batch's TableTransactionError "0:The table specified does not
    exist" (code and status of the failed operation inside the batch)."""
    text = str(exc)
    return (error_code(exc) == "TableNotFound" or "TableNotFound" in text
            or "The table specified does not exist" in text)


def _entity(part: str, row: str, record: Record, at: float,
            kind: Union[str, None] = None) -> dict[str, Any]:
    """The entity of ``record``: its JSON cut into chunk properties (any thread)."""
    entity: dict[str, Any] = {"PartitionKey": part, "RowKey": row,
                              "kind": kind or record.kind, "at": float(at)}
    pieces = chunks(encode(record))
    if isinstance(record, Cancel) and record.ttl is not None:
        entity["expires"] = record.expires()  # so that purge's query finds it
    entity["n"] = len(pieces)
    entity.update({f"d{i}": piece for i, piece in enumerate(pieces)})
    return entity


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise RecordError(f"chunk is {type(value).__name__}, not text")
    return value


def _parse_cursor(cursor: Union[str, None]) -> Union[datetime, None]:
    if cursor is None:
        return None
    try:
        stamp = datetime.fromisoformat(cursor)
    except ValueError:
        return None  # a cursor from another store: start over with all live cancels
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)
