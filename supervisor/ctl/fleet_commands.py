"""``jobq-ctl`` fleet commands, printed: workers, cancel, pause, resume, drain, stop, and
status (main thread; ``result`` is in ctl/result_command.py).  They write control records
(signed with the first --signing-key-file) that the workers' control threads act on; see
docs/architecture.rst, "The fleet layer".  What they read and write is ops/fleet.py, which
the dashboard's request threads call too.

Exit statuses: 2 for bad input or no control store configured, 1 for an unknown task or
worker id and for a queue or control store that cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..backends.base import Backend
from ..core.options import UsageError
from ..fleet.control.base import CANCEL_TTL, ControlStore, worker_state
from ..fleet.control.records import QueueFlag
from ..ops.audit import ids_text, tasks_text
from ..ops.fleet import (
    cancel_tasks,
    live_worker_ids,
    put_commands,
    put_pause,
    status_json,
    status_view,
    who,
    worker_view,
    workers_json,
)
from ..ops.keys import first_key
from ..ops.queue import taken_back
from ..ops.times import duration_text, iso
from .actions_command import note_action

EXIT_NOT_FOUND = 1


def _paused_line(queue: str, flag: QueueFlag | None) -> str | None:
    if flag is None or not flag.paused:
        return None
    return f"queue {queue}: PAUSED by {flag.who} at {iso(flag.when)} (jobq-ctl resume)"


def cmd_workers(ns: argparse.Namespace, backend: Backend | None, store: ControlStore) -> int:
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
    print(f"{'WORKER':32} {'HOST':20} {'PID':>7}  {'VERSION':19} {'STATE':9} {'SLOTS':>5}  "
          f"{'STARTED':20}  HEARTBEAT")
    for r in shown:
        print(f"{r.id:32} {r.host:20} {r.pid:>7}  {r.version:19} {worker_state(r, now):9} "
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
def cmd_cancel(ns: argparse.Namespace, backend: Backend | None, store: ControlStore) -> int:
    grace = 0.0 if ns.now else ns.grace
    if ns.cancel_ttl is None:  # not given (main.py's parser does not import CANCEL_TTL)
        ns.cancel_ttl = CANCEL_TTL
    if not 0 < ns.cancel_ttl <= CANCEL_TTL:
        raise UsageError(f"--cancel-ttl: must be more than 0 and at most "
                         f"{duration_text(CANCEL_TTL)} (the age at which cancels are purged)")
    ids = list(dict.fromkeys(ns.ids))
    states: dict[str, str] | None = None
    back = taken_back(backend, ids) if backend is not None else {}
    admin = backend.admin() if backend is not None else None
    if admin is not None:
        states = admin.task_states(ids)
        unknown = [i for i in ids if i not in states]
        if unknown:
            print(f"jobq-ctl: error: cancel: no task {unknown[0]!r} in queue {ns.queue}"
                  + (f" (and {len(unknown) - 1} more unknown ids)" if len(unknown) > 1 else "")
                  + "; nothing cancelled", file=sys.stderr)
            return EXIT_NOT_FOUND
    live, taken = cancel_tasks(backend, store, ns.queue, ids, states, ns.reason, grace,
                               ns.cancel_ttl, first_key(ns), who())
    if live:
        note_action(ns, store, "cancel", tasks_text(ids, len(live), reason=ns.reason))
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


# ----------------------------------------------------------------- pause / drain / stop
def cmd_flag(ns: argparse.Namespace, store: ControlStore, paused: bool) -> int:
    """``pause`` (``paused``) and ``resume``."""
    put_pause(store, ns.queue, paused, first_key(ns), who())
    note_action(ns, store, "pause" if paused else "resume", "")
    print(f"queue {ns.queue} paused: no worker starts a new task; running tasks go on"
          if paused else f"queue {ns.queue} resumed")
    return 0


def cmd_command(ns: argparse.Namespace, store: ControlStore, action: str) -> int:
    """``drain`` and ``stop`` (``action``) of the named live workers."""
    key = first_key(ns)
    live = live_worker_ids(store, ns.queue)
    names = list(dict.fromkeys(ns.workers))
    unknown = [w for w in names if w not in live]
    if unknown:
        print(f"jobq-ctl: error: {action}: no live worker {unknown[0]!r} on queue "
              f"{ns.queue} (jobq-ctl workers lists them); nothing sent", file=sys.stderr)
        return EXIT_NOT_FOUND
    by, sent = who(), []
    try:  # every command is sent before a line is printed (ctl/stdout.py: ``| head``)
        for worker in names:
            put_commands(store, ns.queue, [worker], action, key, by)
            sent.append(worker)
    finally:
        if sent:
            note_action(ns, store, action, ids_text(sent))
        for worker in sent:
            print(f"{worker}: {action} sent")
    return 0


# ------------------------------------------------------------------------------- status
def cmd_status(ns: argparse.Namespace, backend: Backend, store: ControlStore | None) -> int:
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
