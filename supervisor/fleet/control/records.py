"""Control records: what the fleet layer stores, as JSON documents with a version.

Every record is one JSON object ``{"v": 1, "kind": ..., <fields>}``; the stores keep that
text as it is (SQLite: a TEXT column; Azure Table: string properties), so a signature made
over a record before it was written verifies after it was read.  ``decode`` is strict: bad
JSON, a wrong type, a missing field, an unknown kind or version raise ``RecordError``, and
readers skip that record (logged once, see base.OnceLog).  Unknown *extra* fields are dropped,
so a newer writer's additions do not break an older reader (they are not covered by a
signature either: the MAC covers what a reader understands).

Called from any thread: everything here is pure.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import MISSING, dataclass, fields, replace
from datetime import datetime, timezone
from typing import Any, Union

from ...core.task import storable

VERSION = 1
WORKER_STATES = ("running", "paused", "draining", "stopping")
COMMAND_ACTIONS = ("drain", "stop")
CMD_CHARS = 200  # a worker record shows the first 200 characters of each command
SHORT_CMD_CHARS = 60  # ... or of 60, when 200 would not let every task fit
# Azure Table: 1 MiB per entity, 64 KiB per string property.  A worker document is cut into
# properties of at most CHUNK code points (<= 60 KiB as UTF-16 even if all are astral) and
# may take at most WORKER_DOC_BYTES (see stored_bytes); tasks that do not fit are dropped from
# the end and counted in ``tasks_omitted``.  With 36-character task ids a record holds ~1,400
# tasks with 200-character commands; beyond that commands are cut to SHORT_CMD_CHARS, which
# makes room for ~2,400 tasks (~1,850 if every character of every command is non-ASCII).
CHUNK = 15_000
WORKER_DOC_BYTES = 960_000
CANCEL_TTL = 7 * 86_400.0  # s a cancel applies when it names no ttl of its own

Sig = dict[str, str]


class RecordError(ValueError):
    """A stored document that is not a record this reader understands."""


@dataclass(frozen=True)
class TaskInfo:
    """One running task as its worker reports it: its environment's names, never a value
    (the dashboard shows them masked, as it shows a pending task's from its body)."""

    id: str
    attempt: int
    pid: Union[int, None]
    started: float  # epoch seconds
    lease_expires: Union[float, None]  # epoch seconds
    cmd: str  # the first CMD_CHARS characters
    env_names: tuple[str, ...] = ()  # sorted; none from a worker older than issue 26


@dataclass(frozen=True)
class WorkerRecord:
    id: str
    queue: str
    host: str
    pid: int
    version: str
    state: str  # one of WORKER_STATES; readers show "lost" for a stale heartbeat
    slots_used: int
    slots_total: int
    started: float
    heartbeat: float  # epoch seconds of this upsert
    interval: float = 15.0  # heartbeat interval, so readers know when it is lost
    tasks: tuple[TaskInfo, ...] = ()
    tasks_omitted: int = 0
    succeeded: int = 0  # tasks this worker finished, since it started (the dashboard's chart)
    failed: int = 0  # ... and those that failed for good
    kind = "worker"


@dataclass(frozen=True)
class Cancel:
    queue: str
    task_id: str
    reason: str
    who: str
    when: float
    grace: float = 0.0  # seconds from SIGTERM to SIGKILL; 0 = kill now
    sig: Union[Sig, None] = None
    # Seconds after ``when`` the cancel applies (jobq-ctl cancel --cancel-ttl); None (also
    # every record written before the field existed): CANCEL_TTL.  Written only when set, so
    # a default cancel is the same document -- and signature -- as before.
    ttl: Union[float, None] = None
    kind = "cancel"

    def expires(self) -> float:
        """Epoch seconds after which readers ignore this cancel (any thread)."""
        return self.when + (CANCEL_TTL if self.ttl is None else self.ttl)


def cancel_reason(cancel: Cancel) -> str:
    """How a cancelled task's end is worded wherever it is shown (the failed listing, result
    records, ``push --wait``, ``logs -f``): who, when and why (any thread)."""
    when = datetime.fromtimestamp(cancel.when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"cancelled by {cancel.who} at {when}: {cancel.reason or 'no reason given'}"


@dataclass(frozen=True)
class QueueFlag:
    queue: str
    paused: bool
    who: str
    when: float
    sig: Union[Sig, None] = None
    kind = "flag"


@dataclass(frozen=True)
class Command:
    queue: str
    worker: str
    seq: str  # unique per worker; sorts by time (see new_seq)
    action: str  # one of COMMAND_ACTIONS
    who: str
    when: float
    sig: Union[Sig, None] = None
    kind = "cmd"


RESULT_STATES = ("running", "succeeded", "failed", "cancelled", "lock-lost", "requeued")


@dataclass(frozen=True)
class ResultRecord:
    """One attempt of a task: written when it starts (``running``) and again when it ends
    (``jobq-ctl result``, ``push --wait``, the ``cancelled`` listing).  ``outcome`` is the
    attempt's state, one of RESULT_STATES; ``final``: the task ended for good with this
    attempt (succeeded, failed after its last attempt, cancelled)."""

    queue: str
    task_id: str
    attempt: int
    outcome: str  # one of RESULT_STATES
    reason: str
    tail: str  # the last lines of output
    exit_status: Union[int, None]
    worker: str
    when: float  # when the record was written
    signal: Union[int, None] = None  # the signal that ended the task's shell
    started: Union[float, None] = None  # epoch seconds
    finished: Union[float, None] = None  # epoch seconds; None while running
    final: bool = False
    max_attempts: Union[int, None] = None
    cancelled_by: str = ""
    unique_key: Union[str, None] = None  # the task's; a final record releases its claim
    kind = "result"


@dataclass(frozen=True)
class AuditRecord:
    """One operator action (jobq-ctl's or the dashboard's: pause, cancel, requeue, clear...),
    kept for AUDIT_TTL: who did what, when, from where (ops/audit.py words them)."""

    queue: str
    seq: str  # new_seq(when): unique, sorts by time
    who: str  # jobq-ctl: user@host; the dashboard: the login
    action: str  # "pause", "cancel", "requeue", "clear", ...
    detail: str  # what it applied to (task ids, worker ids), one line
    when: float
    sig: Union[Sig, None] = None  # signed with the operator's key, as their other records
    via: str = "dashboard"  # "jobq-ctl" or "dashboard" (every record older than the field)
    kind = "audit"


@dataclass(frozen=True)
class HistoryPoint:
    """One minute of one queue, as the dashboard's sampler saw it (the overview's charts
    after a restart): the depth counts the backend reports at the minute's last sample, and
    the tasks that finished in the minute (None: unknown).  Several dashboards write the
    same minute's row; the last write wins."""

    queue: str
    minute: float  # epoch seconds of the minute's start
    depth: dict[str, int]  # by the backend's word: pending, queued, running
    succeeded: Union[int, None]
    failed: Union[int, None]
    kind = "history"


Record = Union[WorkerRecord, Cancel, QueueFlag, Command, ResultRecord, AuditRecord,
               HistoryPoint]
KINDS: dict[str, type[Record]] = {c.kind: c for c in (WorkerRecord, Cancel, QueueFlag, Command,
                                                       ResultRecord, AuditRecord, HistoryPoint)}


# ----------------------------------------------------------------------------- encoding
def to_doc(record: Record) -> dict[str, object]:
    doc: dict[str, object] = {"v": VERSION, "kind": record.kind}
    for f in fields(record):
        value = getattr(record, f.name)
        if f.name == "tasks":
            value = [_task_doc(task) for task in value]
        if f.name in ("sig", "ttl") and value is None:
            continue
        doc[f.name] = value
    return doc


def _task_doc(task: TaskInfo) -> dict[str, object]:
    return {f.name: list(v) if isinstance(v := getattr(task, f.name), tuple) else v
            for f in fields(task)}


def dumps(doc: dict[str, object]) -> str:
    """The document as JSON text every store can hold: a lone UTF-16 surrogate (a task's
    bytes that are not UTF-8 reach a record as one) is written as its ``\\uXXXX`` escape,
    which decodes back to the same string -- raw, it fails the store's UTF-8 encoding, and a
    batch holding it would fail on every retry."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return storable(text)


def encode(record: Record) -> str:
    """The stored text of ``record``; a worker record is cut to WORKER_DOC_BYTES."""
    if isinstance(record, WorkerRecord):
        record = fit_worker(record)
    return dumps(to_doc(record))


def stored_bytes(text: str) -> int:
    """The larger of the text's size as the service stores it (UTF-16) and as it travels
    (JSON with non-ASCII escaped as \\uXXXX, which is what Azurite measures)."""
    return max(len(text.encode("utf-16-le")), len(json.dumps(text)) - 2)


def fit_worker(record: WorkerRecord) -> WorkerRecord:
    """The record with commands cut to CMD_CHARS; if the document would exceed
    WORKER_DOC_BYTES, commands cut to SHORT_CMD_CHARS and environment names left out, and
    if that is not enough either, as many tasks as fit (the rest counted in
    ``tasks_omitted``)."""
    for limit in (CMD_CHARS, SHORT_CMD_CHARS):
        tasks = tuple(t if len(t.cmd) <= limit and (limit == CMD_CHARS or not t.env_names)
                      else replace(t, cmd=t.cmd[:limit],
                                   env_names=t.env_names if limit == CMD_CHARS else ())
                      for t in record.tasks)
        size = stored_bytes(dumps(to_doc(replace(record, tasks=()))))
        keep = 0
        for task in tasks:
            # each task adds its own text and a comma (2 bytes as UTF-16)
            size += stored_bytes(dumps(_task_doc(task))) + 2
            if size > WORKER_DOC_BYTES:
                break
            keep += 1
        if keep == len(tasks):
            return replace(record, tasks=tasks)
    return replace(record, tasks=tasks[:keep],
                   tasks_omitted=record.tasks_omitted + len(tasks) - keep)


def chunks(text: str) -> list[str]:
    return [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]


# ----------------------------------------------------------------------------- decoding
def decode(text: object, kind: str | None = None) -> Record:
    """Parse one stored document; ``kind``: the kind its key says it must be."""
    if not isinstance(text, str):
        raise RecordError(f"not text but {type(text).__name__}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"bad JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RecordError("not a JSON object")
    if doc.get("v") != VERSION:
        raise RecordError(f"unknown version {doc.get('v')!r}")
    cls = KINDS.get(doc.get("kind"))  # type: ignore[arg-type]
    if cls is None or (kind is not None and doc.get("kind") != kind):
        raise RecordError(f"unexpected kind {doc.get('kind')!r}")
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in doc:
            if f.default is not MISSING or f.default_factory is not MISSING:
                continue
            raise RecordError(f"{cls.kind}: missing {f.name!r}")
        values[f.name] = _check(cls.kind, f.name, doc[f.name])
    record = cls(**values)
    _validate(record)
    return record


_STR = ("id", "queue", "host", "version", "state", "task_id", "reason", "who", "worker",
        "seq", "action", "outcome", "tail", "cmd", "cancelled_by", "detail", "via")
_INT = ("pid", "slots_used", "slots_total", "tasks_omitted", "attempt", "succeeded", "failed")
_FLOAT = ("started", "heartbeat", "interval", "when", "grace", "minute")
_OPT_INT = ("exit_status", "signal", "max_attempts")
_OPT_FLOAT = ("lease_expires", "ttl", "finished")
_OPT_STR = ("unique_key",)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check(kind: str, name: str, v: Any) -> Any:
    ok: bool
    if name == "started" and kind == "result":  # unknown (None) in a result record
        ok = v is None or _is_num(v)
        v = float(v) if ok and v is not None else v
    elif name in ("succeeded", "failed") and kind == "history":  # unknown (None) there
        ok = v is None or _is_int(v)
    elif name == "depth":
        ok = isinstance(v, dict) and all(isinstance(k, str) and _is_int(n) and n >= 0
                                         for k, n in v.items())
    elif name in _STR:
        ok = isinstance(v, str)
    elif name in _INT:
        ok = _is_int(v)
    elif name in _FLOAT:
        ok = _is_num(v)
        v = float(v) if ok else v
    elif name in _OPT_INT:
        ok = v is None or _is_int(v)
    elif name in _OPT_FLOAT:
        ok = v is None or _is_num(v)
        v = float(v) if ok and v is not None else v
    elif name in _OPT_STR:
        ok = v is None or isinstance(v, str)
    elif name in ("paused", "final"):
        ok = isinstance(v, bool)
    elif name == "sig":
        ok = v is None or (isinstance(v, dict) and len(v) == 2
                           and all(isinstance(v.get(k), str) for k in ("kid", "mac")))
    elif name == "tasks":
        if not isinstance(v, list):
            raise RecordError(f"{kind}: tasks is not a list")
        return tuple(_task(kind, t) for t in v)
    elif name == "env_names":
        ok = isinstance(v, list) and all(isinstance(n, str) for n in v)
        v = tuple(v) if ok else v
    else:  # pragma: no cover - every field is listed above
        raise RecordError(f"{kind}: no rule for {name!r}")
    if not ok:
        raise RecordError(f"{kind}: bad {name!r}: {type(v).__name__}")
    return v


def _task(kind: str, t: object) -> TaskInfo:
    if not isinstance(t, dict):
        raise RecordError(f"{kind}: a task is not an object")
    try:
        return TaskInfo(**{f.name: _check(kind, f.name, t[f.name]) for f in fields(TaskInfo)
                           if f.name in t or f.default is MISSING})
    except KeyError as exc:
        raise RecordError(f"{kind}: a task lacks {exc}") from None


def _validate(record: Record) -> None:
    if isinstance(record, WorkerRecord) and record.state not in WORKER_STATES:
        raise RecordError(f"worker: unknown state {record.state!r}")
    if isinstance(record, Command) and record.action not in COMMAND_ACTIONS:
        raise RecordError(f"cmd: unknown action {record.action!r}")
    if isinstance(record, ResultRecord) and record.outcome not in RESULT_STATES:
        raise RecordError(f"result: unknown state {record.outcome!r}")
    if isinstance(record, Cancel) and record.grace < 0:
        raise RecordError("cancel: negative grace")
    if isinstance(record, Cancel) and record.ttl is not None and record.ttl <= 0:
        raise RecordError("cancel: ttl not positive")


def new_seq(now: float) -> str:
    """A command's ``seq``: sorts by time (milliseconds), unique by 48 random bits."""
    return f"{int(now * 1000):015d}-{secrets.token_hex(6)}"
