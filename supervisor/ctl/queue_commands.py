"""``jobq-ctl`` queue sub-commands on top of any Backend: push, peek, failed, requeue, clear,
prune (the fleet ones are in fleet_commands.py; the dispatch table in commands.py).  Main
thread."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial
from typing import TypedDict, TypeVar

from ..backends.base import Backend, BackendError
from ..core.options import UsageError
from ..core.settings import format_duration, parse_duration
from ..core.signing import sign_task
from ..core.task import DEFAULT_PRIORITY, MAX_NOT_BEFORE, MAX_PRIORITY, Task, TaskFormatError
from ..fleet.control.base import ControlStore
from ..fleet.control.unique import push_unique
from ..ops.audit import count_text, tasks_text
from ..ops.follow import Sources
from ..ops.keys import first_key
from ..ops.queue import all_failed_ids, forget_cancels, requeue_ids, taken_back
from ..ops.task_ends import failed_listing
from ..ops.times import iso, iso_or_none, iso_times
from .actions_command import note_action
from .output_commands import after_push
from .stdout import print_or_drop

# set by the worker for every task (worker/launch.py); a task's env cannot override them
WORKER_SET = ("JOBQ_TASK_ID", "JOBQ_QUEUE_NAME", "JOBQ_ATTEMPT")
def dumps(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env: expected K=V, got {pair!r}")
        if key in WORKER_SET:
            raise UsageError(f"--env: {key} is set by the worker for each task")
        env[key] = value
    return env


def _read_commands(path: str) -> list[tuple[int, str]]:
    """The commands of ``--file`` with their line numbers (1-based)."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        raise UsageError(f"--file: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--file: {path} is not UTF-8 text") from None
    return [(n, line) for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")]


def _not_before(ns: argparse.Namespace, now: float) -> float | None:
    """--delay or --not-before as wall-clock epoch seconds (None: neither given)."""
    if ns.delay is not None:
        return now + ns.delay if ns.delay > 0 else None
    if ns.not_before is None:
        return None
    text = ns.not_before.strip()
    try:  # Python < 3.11 reads no "Z"
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "zZ" and text
                                      else text)
    except ValueError:
        raise UsageError(f"--not-before: {ns.not_before!r} is not an ISO-8601 time (e.g. "
                         "2026-11-24T18:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _unique_key(task: Task) -> str:
    """--unique: a hash of what the task runs (command, env, cwd), not of its id."""
    what = json.dumps([task.cmd, sorted(task.env.items()), task.cwd])
    return "sha256:" + hashlib.sha256(what.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class _Schedule(TypedDict, total=False):
    """What push_schedule changes of each task."""

    priority: int
    not_before: float
    timeout: float


def push_schedule(ns: argparse.Namespace, backend: Backend, tasks: list[Task], now: float,
                  store: ControlStore | None = None) -> list[Task]:
    """The tasks with --priority, --delay/--not-before, --timeout and --unique(-key) applied,
    or a UsageError naming the option (bad value, or what ``backend`` cannot do; unique keys
    on a ``unique_by_control`` backend need ``store``)."""
    name = backend.name
    changes: _Schedule = {}
    if ns.priority is not None:
        if not 0 <= ns.priority <= MAX_PRIORITY:
            raise UsageError(f"--priority: must be 0..{MAX_PRIORITY} (higher first), got "
                             f"{ns.priority}")
        if not backend.priorities:
            raise UsageError(f"--priority: {name} has no message priority; push urgent tasks "
                             "to a queue of their own and give the worker several queues")
        changes["priority"] = ns.priority
    not_before = _not_before(ns, now)
    if not_before is not None and not_before > now:
        ahead = not_before - now
        option = "--delay" if ns.delay is not None else "--not-before"
        if not_before >= MAX_NOT_BEFORE:
            raise UsageError(f"{option}: later than the year 5000")
        if backend.max_delay is not None and ahead > backend.max_delay:
            raise UsageError(f"{option}: {name} can hold a task back at most "
                             f"{backend.max_delay / 86400:g} days, this is {ahead / 86400:.1f}")
        changes["not_before"] = round(not_before, 3)
    if ns.timeout is not None:
        try:
            timeout = parse_duration(ns.timeout)
        except ValueError as exc:
            raise UsageError(f"--timeout: {exc}") from None
        if timeout <= 0:
            raise UsageError(f"--timeout: must be more than 0, got {ns.timeout!r}")
        changes["timeout"] = timeout
    if ns.unique_key is not None or ns.unique:
        option = "--unique-key" if ns.unique_key is not None else "--unique"
        if not backend.unique_tasks and not backend.unique_by_control:
            raise UsageError(f"{option}: {name} cannot find a pending or running task by key "
                             "(the service has no index of its messages)")
        if not backend.unique_tasks and store is None:
            raise UsageError(f"{option}: {name} has no index of its messages, so unique keys "
                             "are claimed in the control store, and there is none (set "
                             "--control-account-url or --control-connection-string)")
        if ns.unique_key is not None and len(tasks) > 1:
            raise UsageError("--unique-key: one key for several tasks would push only the "
                             "first; use --unique (a key per command)")
    try:
        tasks = [replace(t, **changes) for t in tasks]
        if ns.unique_key is not None:
            tasks = [replace(t, unique_key=ns.unique_key) for t in tasks]
        elif ns.unique:
            tasks = [replace(t, unique_key=_unique_key(t)) for t in tasks]
    except TaskFormatError as exc:
        raise UsageError(f"push: {exc}") from None
    return tasks


T = TypeVar("T")


def _checked(where: str, make: Callable[[], T]) -> T:
    """``make()``, its TaskFormatError a UsageError naming ``where`` (a --file line): one bad
    command refuses the whole push, nothing is pushed."""
    try:
        return make()
    except TaskFormatError as exc:
        raise UsageError(f"push: {where + ': ' if where else ''}{exc}") from None


def cmd_push(ns: argparse.Namespace, backend: Backend, sources: Sources | None = None,
             store: ControlStore | None = None) -> int:
    """``sources``: given for --wait/--follow (opened before anything is pushed); ``store``:
    where unique keys are claimed on a ``unique_by_control`` backend."""
    # each command with where it came from, so that an error names it
    commands = [(f"-c #{i}", c) for i, c in enumerate(ns.commands, 1)]
    if ns.file:
        from_file = _read_commands(ns.file)
        if not from_file:
            raise UsageError(f"--file: {ns.file} held no command (blank lines and # comments "
                             "are skipped)")
        commands += [(f"--file {ns.file} line {n}", c) for n, c in from_file]
    if not commands:
        raise UsageError("push: give -c CMD or --file F")
    if ns.task_max_attempts is not None and ns.task_max_attempts < 1:
        raise UsageError("--max-attempts: must be at least 1")
    env = _env_pairs(ns.env)
    if ns.cwd is not None and not os.path.isabs(ns.cwd):
        # The worker would resolve it against its own working directory, not the pusher's.
        raise UsageError(f"--cwd: must be an absolute directory on the worker's host, got "
                         f"{ns.cwd!r}")
    key = first_key(ns)
    named = len(commands) > 1 or bool(ns.file)
    tasks = [_checked(where if named else "", partial(
        Task, cmd=c, env=env, cwd=ns.cwd, max_attempts=ns.task_max_attempts))
        for where, c in commands]
    now = time.time()
    tasks = push_schedule(ns, backend, tasks, now, store)  # names its option itself
    if key is not None:
        tasks = [_checked("", partial(sign_task, t, key, now)) for t in tasks]
    for (where, _), task in zip(commands, tasks):
        _checked(where if named else "", task.to_json)
    if store is not None and not backend.unique_tasks and any(t.unique_key for t in tasks):
        ids = push_unique(store, backend.push, ns.queue, tasks, now)
    else:
        ids = backend.push(tasks)
    for task, task_id in zip(tasks, ids):
        if task_id != task.id:  # skipped: stdout keeps one id per task, the live one's
            print(f"jobq-ctl: skipped: unique key {task.unique_key!r} is held by pending or "
                  f"running task {task_id}", file=sys.stderr)
        print_or_drop(task_id)  # every task is pushed: a reader gone changes nothing
    warn_unserved(ns, backend)
    if sources is not None:
        return after_push(ids, ns, sources)
    return 0


def warn_unserved(ns: argparse.Namespace, backend: Backend) -> None:
    """After a push: say so when no worker has ever served the queue (SQLite: a mistyped
    --queue, or a database no worker uses; the push stands, exit 0)."""
    try:
        served = backend.served_queues()
    except BackendError:
        return  # the tasks are pushed; this was only a courtesy
    if served is None or ns.queue in served:
        return
    where = f" in {backend.location}" if backend.location else ""
    print(f"jobq-ctl: warning: no worker has ever served queue {ns.queue!r}{where} (served: "
          f"{', '.join(served) or 'none'}); the tasks wait until a worker starts on it",
          file=sys.stderr)


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
