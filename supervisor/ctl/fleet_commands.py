"""``jobq-ctl`` fleet commands: workers, cancel, pause, resume, drain, stop, and status (main
thread; ``result`` is in ctl_result.py).  They write control records (signed with the first
--signing-key-file) that the workers' control threads act on; see docs/architecture.rst,
"The fleet layer".  The data-returning helpers (``status_json``, ``workers_json``,
``put_pause``, ``put_commands``) are also called by the dashboard's request threads, each with
its own backend and store.

Exit statuses: 2 for bad input or no control store configured, 1 for an unknown task or
worker id and for a queue or control store that cannot be reached.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from ..backends.base import Backend, QueueStatus
from ..core.options import UsageError
from ..core.signing import SigningKey
from ..fleet.control.base import CANCEL_TTL, ControlStore, ControlStoreError, worker_state
from ..fleet.control.open import open_control_store
from ..fleet.control.records import Cancel, Command, QueueFlag, WorkerRecord, cancel_reason, new_seq
from ..fleet.control.signing import sign
from ..ops.task_ends import NEVER_RAN
from .queue_commands import READ_ONLY_COMMANDS, first_key, iso, iso_or_none, taken_back

log = logging.getLogger("jobq.ctl")
clock: Callable[[], float] = time.time  # wall clock of the records (tests replace it)

FLEET_COMMANDS = frozenset({"workers", "cancel", "pause", "resume", "drain", "stop", "result"})
EXIT_NOT_FOUND = 1
# A poll cursor past every cancel, per store: reading the flag must not list 7 days of cancels.
_NO_CANCELS = {"sqlite": str(2**62), "azure-table": "9999-12-31T00:00:00+00:00"}


def needs_backend(command: str, settings: Any) -> bool:
    """The queue commands and status need the backend; the fleet ones only on SQLite (to
    check the database and, for cancel, the task ids)."""
    return command not in FLEET_COMMANDS or settings.backend == "sqlite"


def _no_store(command: str, settings: Any) -> str:
    if settings.control == "off":
        return f"{command}: the control store is off (--control off); use --control auto"
    if settings.backend == "servicebus":
        return (f"{command}: no control store: Service Bus has no storage account; set "
                f"--control-account-url or --control-connection-string (env "
                f"JOBQ_CONTROL_CONNECTION_STRING)")
    return (f"{command}: no control store: the table endpoint of this account is not known; "
            f"set --control-account-url or --control-connection-string")


def open_store(command: str, settings: Any) -> ControlStore | None:
    """The control store for ``command``.  A fleet command without one is a UsageError;
    status and requeue go on without one (status then shows its control part as unknown;
    requeue cannot clear the cancels of what it brings back, and says so; failed lists what
    the backend keeps)."""
    optional = command in ("status", "requeue", "failed")
    try:
        store = open_control_store(settings, create=command not in READ_ONLY_COMMANDS)
    except ControlStoreError as exc:
        if not optional:
            raise
        print(f"jobq-ctl: warning: {exc}", file=sys.stderr)
        return None
    if store is None and not optional:
        raise UsageError(_no_store(command, settings))
    return store


def who() -> str:
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def read_flag(store: ControlStore, queue: str) -> QueueFlag | None:
    snap = store.poll(queue, "jobq-ctl", _NO_CANCELS.get(store.name))
    return snap.flag


def duration_text(seconds: float) -> str:
    s = int(max(0.0, seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60),
                                      ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // sub_size:02d}{sub}"
    return f"{s}s"


# ------------------------------------------------------------------------------ workers
def worker_json(r: WorkerRecord, now: float, paused: bool | None) -> dict[str, Any]:
    return {
        "id": r.id, "queue": r.queue, "host": r.host, "pid": r.pid, "version": r.version,
        "state": worker_state(r, now), "slots": {"used": r.slots_used, "total": r.slots_total},
        "started": iso(r.started), "last_heartbeat": iso(r.heartbeat),
        "heartbeat_interval_s": r.interval, "queue_paused": paused,
        "tasks_omitted": r.tasks_omitted,
        "finished": {"succeeded": r.succeeded, "failed": r.failed},
        "tasks": [{"id": t.id, "attempt": t.attempt, "pid": t.pid, "started": iso(t.started),
                   "running_s": round(max(0.0, now - t.started), 1),
                   "lease_expires": iso_or_none(t.lease_expires), "cmd": t.cmd}
                  for t in r.tasks],
    }


def _paused_line(queue: str, flag: QueueFlag | None) -> str | None:
    if flag is None or not flag.paused:
        return None
    return f"queue {queue}: PAUSED by {flag.who} at {iso(flag.when)} (jobq-ctl resume)"


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


def workers_json(store: ControlStore, queue: str, show_all: bool) -> list[dict[str, Any]]:
    """The list ``jobq-ctl workers --json`` prints."""
    now, shown, _, flag = worker_view(store, queue, show_all)
    return [worker_json(r, now, bool(flag and flag.paused)) for r in shown]


def cmd_workers(ns: Any, backend: Backend | None, store: ControlStore) -> int:
    if ns.json:
        print(json.dumps(workers_json(store, ns.queue, ns.all), indent=2))
        return 0
    now, shown, lost, flag = worker_view(store, ns.queue, ns.all)
    line = _paused_line(ns.queue, flag)
    if line:
        print(line)
    if not shown:
        print(f"no live workers on queue {ns.queue}"
              + (f" ({len(lost)} lost: --all shows them)" if lost else ""))
        return 0
    print(f"{'WORKER':32} {'HOST':20} {'PID':>7}  {'VERSION':9} {'STATE':9} {'SLOTS':>5}  "
          f"{'STARTED':20}  HEARTBEAT")
    for r in shown:
        print(f"{r.id:32} {r.host:20} {r.pid:>7}  {r.version:9} {worker_state(r, now):9} "
              f"{f'{r.slots_used}/{r.slots_total}':>5}  {iso(r.started):20}  "
              f"{iso(r.heartbeat)} ({duration_text(now - r.heartbeat)} ago)")
        for t in r.tasks:
            print(f"    {t.id}  attempt {t.attempt}  pid {t.pid or '-'}  running "
                  f"{duration_text(now - t.started)}  lease expires "
                  f"{iso(t.lease_expires)}  $ {t.cmd}")
        if r.tasks_omitted:
            print(f"    ... and {r.tasks_omitted} more tasks (the record's size limit)")
    return 0


# ------------------------------------------------------------------------------- cancel
def cmd_cancel(ns: Any, backend: Backend | None, store: ControlStore) -> int:
    grace = 0.0 if ns.now else ns.grace
    if not 0 < ns.cancel_ttl <= CANCEL_TTL:
        raise UsageError(f"--cancel-ttl: must be more than 0 and at most "
                         f"{duration_text(CANCEL_TTL)} (the age at which cancels are purged)")
    ids = list(dict.fromkeys(ns.ids))
    states: dict[str, str] | None = None
    back = taken_back(backend, ids) if backend is not None else {}
    if backend is not None and backend.name == "sqlite":
        from ..backends.sqlite.admin import task_states

        states = task_states(backend, ids)  # type: ignore[arg-type]
        unknown = [i for i in ids if i not in states]
        if unknown:
            print(f"jobq-ctl: error: cancel: no task {unknown[0]!r} in queue {ns.queue}"
                  + (f" (and {len(unknown) - 1} more unknown ids)" if len(unknown) > 1 else "")
                  + "; nothing cancelled", file=sys.stderr)
            return EXIT_NOT_FOUND
    live, taken = cancel_tasks(backend, store, ns.queue, ids, states, ns.reason, grace,
                               ns.cancel_ttl, first_key(ns), who())
    for task_id in ids:
        if task_id in back:  # its worker is gone: nobody would have stopped it
            gone = (f"{task_id}: its worker {back[task_id].worker or '?'} is gone (its "
                    f"process ended): taken back")
            if task_id in taken:
                print(f"{gone} and cancelled (it will not run)")
            elif task_id not in live:
                print(f"{gone}, failed on its last attempt; nothing to cancel")
            else:  # another worker received it in between: it sees the cancel at claim
                print(f"{gone}; another worker took it since: cancel recorded, that worker "
                      f"stops it")
        elif states is not None and task_id not in live:
            print(f"{task_id}: already {states[task_id]}; nothing to cancel")
        elif task_id in taken:
            print(f"{task_id}: cancelled (it was pending and will not run)")
        elif states is not None:
            print(f"{task_id}: cancel recorded; its worker stops it (SIGTERM, SIGKILL after "
                  f"{duration_text(grace)})")
        else:
            print(f"{task_id}: cancel recorded (kept {duration_text(ns.cancel_ttl)}): a "
                  f"worker running it stops it, a worker receiving it does not run it")
    return 0


def cancel_tasks(backend: Backend | None, store: ControlStore, queue: str, ids: list[str],
                 states: dict[str, str] | None, reason: str, grace: float, ttl: float,
                 key: SigningKey | None, by: str) -> tuple[list[str], set[str]]:
    """Cancel ``ids`` (``states``: their SQLite states, None on the other backends): (the
    ids still live, so cancelled; those of them that were pending and will not run).  The
    caller's thread (jobq-ctl's main thread, a dashboard request thread)."""
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
    if states is not None and live:
        from ..backends.sqlite.admin import cancel_pending

        # worded as a worker words a cancel it finds at claim time (task_ends.py)
        text = cancel_reason(Cancel(queue=queue, task_id="", reason=reason, who=by,
                                    when=now)) + NEVER_RAN
        taken = cancel_pending(backend, live, text, now)  # type: ignore[arg-type]
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


def _flag(paused: bool) -> Callable[[Any, Backend | None, ControlStore], int]:
    def run(ns: Any, backend: Backend | None, store: ControlStore) -> int:
        put_pause(store, ns.queue, paused, first_key(ns), who())
        print(f"queue {ns.queue} paused: no worker starts a new task; running tasks go on"
              if paused else f"queue {ns.queue} resumed")
        return 0
    return run


def _command(action: str) -> Callable[[Any, Backend | None, ControlStore], int]:
    def run(ns: Any, backend: Backend | None, store: ControlStore) -> int:
        key = first_key(ns)
        live = live_worker_ids(store, ns.queue)
        names = list(dict.fromkeys(ns.workers))
        unknown = [w for w in names if w not in live]
        if unknown:
            print(f"jobq-ctl: error: {action}: no live worker {unknown[0]!r} on queue "
                  f"{ns.queue} (jobq-ctl workers lists them); nothing sent", file=sys.stderr)
            return EXIT_NOT_FOUND
        by, sent = who(), []
        try:  # every command is sent before a line is printed (ctl_stdout.py: ``| head``)
            for worker in names:
                put_commands(store, ns.queue, [worker], action, key, by)
                sent.append(worker)
        finally:
            for worker in sent:
                print(f"{worker}: {action} sent")
        return 0
    return run


# ------------------------------------------------------------------------------- status
def _running_from_records(records: list[WorkerRecord], now: float) -> list[dict[str, Any]]:
    return [{"id": t.id, "worker": r.id, "attempt": t.attempt, "pid": t.pid,
             "locked_at": t.started, "locked_until": t.lease_expires}
            for r in records if worker_state(r, now) != "lost" for t in r.tasks]


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
            if not running and backend.name != "sqlite":  # the backend cannot tell
                running = _running_from_records(store.workers(queue), now)
        except ControlStoreError as exc:
            warning = str(exc)
            known = False
    paused = bool(flag and flag.paused) if known else None
    return st, running, age, flag, paused, warning


def status_json(backend: Backend, store: ControlStore | None, queue: str
                ) -> tuple[dict[str, Any], str | None]:
    """The object ``jobq-ctl status --json`` prints, and the control store's warning."""
    st, running, age, _, paused, warning = status_view(backend, store, queue)
    keys = ("locked_at", "locked_until")
    out = [{k: iso_or_none(v) if k in keys else v for k, v in r.items()} for r in running]
    return {"counts": st.counts, "running": out, "note": st.note,
            "oldest_pending_age_s": None if age is None else round(age, 1),
            "paused": paused}, warning


def cmd_status(ns: Any, backend: Backend | None, store: ControlStore | None) -> int:
    assert backend is not None
    if ns.json:
        data, warning = status_json(backend, store, ns.queue)
        if warning:
            print(f"jobq-ctl: warning: {warning}", file=sys.stderr)
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
        return 0
    st, running, age, flag, _, warning = status_view(backend, store, ns.queue)
    if warning:
        print(f"jobq-ctl: warning: {warning}", file=sys.stderr)
    print("  ".join(f"{k}={v}" for k, v in st.counts.items()))
    if st.note:
        print(f"note: {st.note}")
    line = _paused_line(ns.queue, flag)
    if line:
        print(line)
    if age is not None:
        print(f"oldest pending: {duration_text(age)}")
    if running:
        print(f"{'TASK':34} {'WORKER':30} {'ATTEMPT':>7}  {'SINCE':20}  LOCKED UNTIL")
        for r in running:
            worker = str(r.get('worker') or '-') + (" (gone)" if r.get("owner_gone") else "")
            print(f"{r['id']:34} {worker:30} {r.get('attempt', 0):>7}  "
                  f"{iso(r.get('locked_at')):20}  {iso(r.get('locked_until'))}")
    return 0


def _result(ns: Any, backend: Backend | None, store: ControlStore) -> int:
    from .result_command import cmd_result  # it imports this module

    return cmd_result(ns, backend, store)


HANDLERS: dict[str, Callable[[Any, Any, Any], int]] = {
    "workers": cmd_workers,
    "cancel": cmd_cancel,
    "pause": _flag(True),
    "resume": _flag(False),
    "drain": _command("drain"),
    "stop": _command("stop"),
    "status": cmd_status,
    "result": _result,
}
