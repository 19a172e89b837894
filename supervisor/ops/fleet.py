"""The fleet as an operator sees and steers it, as data: the workers of a queue and their
tasks (``worker_view``, ``workers_json``), the queue's status (``status_view``,
``status_json``), and the control records an operator writes -- cancels, the pause flag,
drain/stop commands, signed with the operator's key when given.  ``jobq-ctl`` prints these
(ctl/fleet_commands.py); the dashboard's request threads serve them, each with its own
backend and store (docs/architecture.rst, "The fleet layer").  The caller's thread.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Callable
from typing import Any, TypedDict

from ..backends.base import Backend, QueueStatus
from ..core.signing import SigningKey
from ..fleet.control.base import CANCEL_TTL, ControlStore, ControlStoreError, worker_state
from ..fleet.control.records import Cancel, Command, QueueFlag, WorkerRecord, cancel_reason, new_seq
from ..fleet.control.signing import sign
from .task_ends import NEVER_RAN
from .times import iso, iso_or_none

clock: Callable[[], float] = time.time  # wall clock of the records (tests replace it)


class TaskJson(TypedDict):
    id: str
    attempt: int
    pid: int | None
    started: str
    running_s: float
    lease_expires: str | None
    cmd: str


class WorkerJson(TypedDict):
    """One worker as ``jobq-ctl workers --json`` prints it."""

    id: str
    queue: str
    host: str
    pid: int
    version: str
    state: str
    slots: dict[str, int]
    started: str
    last_heartbeat: str
    last_seen_s: float  # seconds since the last heartbeat
    heartbeat_interval_s: float
    queue_paused: bool | None
    tasks_omitted: int
    finished: dict[str, int]
    tasks: list[TaskJson]


class StatusJson(TypedDict):
    """The object ``jobq-ctl status --json`` prints."""

    counts: dict[str, int]
    running: list[dict[str, Any]]
    note: str | None
    oldest_pending_age_s: float | None
    paused: bool | None


def who() -> str:
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def read_flag(store: ControlStore, queue: str) -> QueueFlag | None:
    # a cursor past every cancel: reading the flag must not list 7 days of cancels
    return store.poll(queue, "jobq-ctl", store.end_cursor).flag


# ------------------------------------------------------------------------------ workers
def worker_json(r: WorkerRecord, now: float, paused: bool | None) -> WorkerJson:
    return {
        "id": r.id, "queue": r.queue, "host": r.host, "pid": r.pid, "version": r.version,
        "state": worker_state(r, now), "slots": {"used": r.slots_used, "total": r.slots_total},
        "started": iso(r.started), "last_heartbeat": iso(r.heartbeat),
        "last_seen_s": round(max(0.0, now - r.heartbeat), 1),
        "heartbeat_interval_s": r.interval, "queue_paused": paused,
        "tasks_omitted": r.tasks_omitted,
        "finished": {"succeeded": r.succeeded, "failed": r.failed},
        "tasks": [{"id": t.id, "attempt": t.attempt, "pid": t.pid, "started": iso(t.started),
                   "running_s": round(max(0.0, now - t.started), 1),
                   "lease_expires": iso_or_none(t.lease_expires), "cmd": t.cmd}
                  for t in r.tasks],
    }


def worker_view(store: ControlStore, queue: str, show_all: bool
                ) -> tuple[float, list[WorkerRecord], list[WorkerRecord], QueueFlag | None]:
    """(now, the records to show, the lost ones, the queue's flag): what ``jobq-ctl workers``
    and the dashboard show (the caller's thread; raises ControlStoreError)."""
    now = clock()
    records = sorted(store.workers(queue), key=lambda r: r.id)
    flag = read_flag(store, queue)
    lost = [r for r in records if worker_state(r, now) == "lost"]
    shown = records if show_all else [r for r in records if r not in lost]
    return now, shown, lost, flag


def workers_json(store: ControlStore, queue: str, show_all: bool) -> list[WorkerJson]:
    """The list ``jobq-ctl workers --json`` prints."""
    now, shown, _, flag = worker_view(store, queue, show_all)
    return [worker_json(r, now, bool(flag and flag.paused)) for r in shown]


# ------------------------------------------------------------------------------- cancel
def cancel_tasks(backend: Backend | None, store: ControlStore, queue: str, ids: list[str],
                 states: dict[str, str] | None, reason: str, grace: float, ttl: float,
                 key: SigningKey | None, by: str) -> tuple[list[str], set[str]]:
    """Cancel ``ids`` (``states``: their states where the queue tells, ``Backend.admin``;
    None elsewhere): (the ids still live, so cancelled; those of them that were pending and
    will not run).  The caller's thread (jobq-ctl's main thread, a dashboard request
    thread)."""
    now = clock()
    live = [i for i in ids if states is None or states[i] in ("pending", "running")]
    # The record first: a worker that claims a pending task between the two writes below
    # finds the cancel at claim time.
    for task_id in live:
        # the default ttl is left out: the same record (and signature) older workers read
        cancel = Cancel(queue=queue, task_id=task_id, reason=reason, who=by, when=now,
                        grace=grace, ttl=None if ttl == CANCEL_TTL else float(ttl))
        store.put_cancel(sign(cancel, key) if key is not None else cancel)
    taken: set[str] = set()
    admin = backend.admin() if backend is not None else None
    if states is not None and live and admin is not None:
        # worded as a worker words a cancel it finds at claim time (ops/task_ends.py)
        text = cancel_reason(Cancel(queue=queue, task_id="", reason=reason, who=by,
                                    when=now)) + NEVER_RAN
        taken = admin.cancel_pending(live, text, now)
    return live, taken


# ----------------------------------------------------------------- pause / drain / stop
def put_pause(store: ControlStore, queue: str, paused: bool, key: SigningKey | None,
              by: str) -> QueueFlag:
    """Write the queue's pause/resume flag, signed with ``key`` when given (the caller's
    thread; raises ControlStoreError)."""
    flag = QueueFlag(queue=queue, paused=paused, who=by, when=clock())
    store.put_flag(sign(flag, key) if key is not None else flag)
    return flag


def live_worker_ids(store: ControlStore, queue: str) -> set[str]:
    """The ids of the queue's workers that are not lost (the caller's thread)."""
    now = clock()
    return {r.id for r in store.workers(queue) if worker_state(r, now) != "lost"}


def put_commands(store: ControlStore, queue: str, workers: list[str], action: str,
                 key: SigningKey | None, by: str) -> None:
    """Send ``action`` (drain, stop) to each of ``workers`` (checked live by the caller;
    the caller's thread; raises ControlStoreError)."""
    now = clock()
    for worker in workers:
        command = Command(queue=queue, worker=worker, seq=new_seq(now), action=action,
                          who=by, when=now)
        store.put_command(sign(command, key) if key is not None else command)


# ------------------------------------------------------------------------------- status
def _running_from_records(records: list[WorkerRecord], now: float) -> list[dict[str, Any]]:
    return [{"id": t.id, "worker": r.id, "attempt": t.attempt, "pid": t.pid,
             "locked_at": t.started, "locked_until": t.lease_expires}
            for r in records if worker_state(r, now) != "lost" for t in r.tasks]


def _with_commands(running: list[dict[str, Any]], records: list[WorkerRecord]
                   ) -> list[dict[str, Any]]:
    """``running`` with each task's command as its worker's record names it (its first
    CMD_CHARS characters; None when no live record lists the task)."""
    cmds = {t.id: t.cmd for r in records for t in r.tasks}
    return [{**row, "cmd": cmds.get(row["id"])} for row in running]


def status_view(backend: Backend, store: ControlStore | None, queue: str
                ) -> tuple[QueueStatus, list[dict[str, Any]], float | None, QueueFlag | None,
                           bool | None, str | None]:
    """(status, running, oldest pending age, flag, paused, warning) of ``queue``: what
    ``jobq-ctl status`` and the dashboard show.  A control store error is the warning (and
    ``paused`` None); a backend error raises (the caller's thread)."""
    st = backend.status()
    now = clock()
    age = backend.oldest_pending_age(now) if backend.tells_age else None
    flag: QueueFlag | None = None
    running = st.running
    known = store is not None
    warning = None
    if store is not None:
        try:
            flag = read_flag(store, queue)
            records = store.workers(queue)
            # a queue without an index of its tasks cannot list the running ones
            if not running and backend.admin() is None:
                running = _running_from_records(records, now)
            running = _with_commands(running, records)
        except ControlStoreError as exc:
            warning = str(exc)
            known = False
    paused = bool(flag and flag.paused) if known else None
    return st, running, age, flag, paused, warning


def status_json(backend: Backend, store: ControlStore | None, queue: str
                ) -> tuple[StatusJson, str | None]:
    """The object ``jobq-ctl status --json`` prints, and the control store's warning."""
    st, running, age, _, paused, warning = status_view(backend, store, queue)
    keys = ("locked_at", "locked_until")
    out = [{k: iso_or_none(v) if k in keys else v for k, v in r.items()} for r in running]
    return {"counts": st.counts, "running": out, "note": st.note,
            "oldest_pending_age_s": None if age is None else round(age, 1),
            "paused": paused}, warning
