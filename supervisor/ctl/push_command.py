"""``jobq-ctl push`` (main thread of jobq-ctl): tasks from -c/--file with their env, cwd,
attempts and schedule (push_schedule), signed with the first --signing-key-file, pushed (unique
keys claimed in the control store where the backend has no index of its messages), one id
printed per task; ``--wait/--follow`` then waits in output_commands.after_push.  A module of
its own so that a plain push imports neither the control records nor the follower (start-up
CPU: commands.py).
"""

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
from typing import TYPE_CHECKING, TypedDict, TypeVar

from ..backends.base import Backend, BackendError
from ..core.options import UsageError
from ..core.settings import parse_duration
from ..core.signing import sign_task
from ..core.task import MAX_NOT_BEFORE, MAX_PRIORITY, Task, TaskFormatError
from ..ops.keys import first_key
from .stdout import print_or_drop

if TYPE_CHECKING:
    from ..fleet.control.base import ControlStore
    from ..ops.follow import Sources

# set by the worker for every task (worker/launch.py); a task's env cannot override them
WORKER_SET = ("JOBQ_TASK_ID", "JOBQ_QUEUE_NAME", "JOBQ_ATTEMPT")
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
        # bound to the queue pushed to: moved into another, the task is refused there
        tasks = [_checked("", partial(sign_task, t, key, now, queue=ns.queue)) for t in tasks]
    for (where, _), task in zip(commands, tasks):
        _checked(where if named else "", task.to_json)
    if store is not None and not backend.unique_tasks and any(t.unique_key for t in tasks):
        # only here: a store was opened for it (clients.py), its modules are imported already
        from ..fleet.control.unique import push_unique

        ids = push_unique(store, backend.push, ns.queue, tasks, now)
    else:
        ids = backend.push(tasks)

    def announce() -> None:
        for task, task_id in zip(tasks, ids):
            if task_id != task.id:  # skipped: stdout keeps one id per task, the live one's
                print(f"jobq-ctl: skipped: unique key {task.unique_key!r} is held by pending "
                      f"or running task {task_id}", file=sys.stderr)
            print_or_drop(task_id)  # every task is pushed: a reader gone changes nothing
        warn_unserved(ns, backend)

    if sources is None:
        announce()
        return 0
    # --wait/--follow only: the follower and the output store's modules
    from .output_commands import after_push

    return after_push(ids, ns, sources, announce)


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
