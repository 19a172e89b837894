"""``jobq-ctl`` queue sub-commands on top of any Backend: peek, failed, requeue, clear, prune
(push is in push_command.py, the fleet ones in fleet_commands.py; the dispatch table in
commands.py).  Main thread."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..backends.base import Backend
from ..core.options import UsageError
from ..core.settings import format_duration
from ..core.task import DEFAULT_PRIORITY, Task
from ..fleet.control.base import ControlStore
from ..ops.audit import count_text, tasks_text
from ..ops.queue import all_failed_ids, forget_cancels, requeue_ids, taken_back
from ..ops.task_ends import failed_listing
from ..ops.times import iso, iso_or_none, iso_times
from .actions_command import note_action


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)


def _schedule_text(task: Task, now: float) -> str:
    """What peek shows besides id and command: a priority other than the default, a time
    it waits for (pushed with --delay/--not-before), its own time limit."""
    parts = []
    if task.not_before is not None and task.not_before > now:
        parts.append(f"delayed until {iso(task.not_before)}")
    if task.priority != DEFAULT_PRIORITY:
        parts.append(f"priority {task.priority}")
    if task.timeout is not None:
        parts.append(f"timeout {task.timeout:g}s")
    return f"[{', '.join(parts)}]  " if parts else ""


def cmd_peek(ns: argparse.Namespace, backend: Backend) -> int:
    items = backend.peek(ns.n)
    now = time.time()
    if ns.json:
        print(dumps([{"id": t.id, "cmd": t.cmd, "env": t.env, "cwd": t.cwd,
                      "max_attempts": t.max_attempts, "priority": t.priority,
                      "not_before": iso_or_none(t.not_before),
                      "delayed": t.not_before is not None and t.not_before > now,
                      "timeout": t.timeout, "unique_key": t.unique_key}
                     if isinstance(t, Task) else {"invalid_body": t} for t in items]))
        return 0
    for t in items:
        if isinstance(t, Task):
            print(f"{t.id}  {_schedule_text(t, now)}{t.cmd}")
        else:
            print(f"(invalid body)  {t[:200]!r}")
    return 0


def cmd_failed(ns: argparse.Namespace, backend: Backend, store: ControlStore | None = None) -> int:
    """The failed and cancelled tasks: the backend's listing with, from the control store
    (when there is one), who cancelled and the worker and output of the attempt that ended
    each task -- the rows the dashboard's /api/failed shows (task_ends.failed_listing);
    ``--json`` adds each task's ``body`` (the dashboard does not show it: it masks env)."""
    records = backend.failed()
    rows, warning = failed_listing(records, store, ns.queue)
    if warning:
        print(f"jobq-ctl: warning: {warning}", file=sys.stderr)
    if ns.json:
        print(dumps([{**iso_times(row), "body": r.body} for row, r in zip(rows, records)]))
        return 0
    for row in rows:
        print(f"{row['id']}  {row['state']} {iso(row['failed_at'])}  attempts="
              f"{row['attempts']}  reason: {row['reason']}")
        print(f"    command: {row['command']}")
        if row["output_tail"]:
            tail = row["output_tail"].splitlines()[-5:]
            print("    output (last lines):")
            for line in tail:
                print(f"      {line}")
    return 0


def cmd_requeue(ns: argparse.Namespace, backend: Backend, store: ControlStore | None = None) -> int:
    if ns.all_failed == bool(ns.ids):
        raise UsageError("requeue: give task ids or --all-failed (not both)")
    if ns.include_cancelled and not ns.all_failed:
        raise UsageError("--include-cancelled: only with --all-failed (a named task comes "
                         "back whether it failed or was cancelled)")
    back = taken_back(backend, [] if ns.all_failed else list(ns.ids))
    ids = all_failed_ids(backend, ns.include_cancelled) if ns.all_failed else list(ns.ids)
    n = requeue_ids(backend, ids) if ns.all_failed else backend.requeue(ns.ids)
    returned = sum(t.status == "pending" for t in back.values())
    if n + returned:
        what = ("failed and cancelled tasks" if ns.include_cancelled else "failed tasks"
                ) if ns.all_failed else "tasks"
        note_action(ns, store, "requeue", tasks_text(list(dict.fromkeys(ids)), n + returned,
                                                     what))
    print(f"requeued {n + returned}")
    for t in back.values():
        print(f"{t.id}: its worker {t.worker or '?'} is gone (its process ended): taken back, "
              + ("pending again (the attempt it ran counts)" if t.status == "pending" else
                 "failed on its last attempt, requeued"))
    forget_cancels(ns.queue, ids, store)
    missing = 0 if ns.all_failed else len(set(ns.ids)) - n - returned
    if missing > 0:
        # exit 1, so that a typo in an id is not taken for success
        print(f"jobq-ctl: error: requeue: {missing} of the given ids matched no failed task",
              file=sys.stderr)
        return 1
    return 0


def cmd_clear(ns: argparse.Namespace, backend: Backend, store: ControlStore | None = None
              ) -> int:
    n = backend.clear(failed=ns.failed)
    if n:
        note_action(ns, store, "clear", count_text(n, "failed tasks" if ns.failed
                                                   else "pending tasks"))
    print(f"deleted {n}")
    return 0


def cmd_prune(ns: argparse.Namespace, backend: Backend, retention: float,
              store: ControlStore | None = None) -> int:
    """Delete the succeeded tasks older than --older-than (default: ``retention``, the
    --retention of the flags, environment or config file) and say how many."""
    if not backend.keeps_succeeded:
        raise UsageError(f"prune: {backend.name} keeps no succeeded tasks (a message is "
                         f"deleted once its task succeeded): nothing to prune")
    if ns.older_than is None and not retention:
        raise UsageError("prune: --retention is 0 (succeeded tasks are kept for ever); give "
                         "--older-than to prune anyway")
    age = retention if ns.older_than is None else ns.older_than
    n = backend.prune_succeeded(time.time() - age)
    if n:
        note_action(ns, store, "prune", count_text(
            n, f"succeeded tasks older than {format_duration(age)}"))
    print(f"pruned {n} succeeded task(s) older than {format_duration(age)}")
    return 0
