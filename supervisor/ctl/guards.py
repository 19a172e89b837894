"""What ``jobq-ctl`` refuses before it opens a queue or a store: a push into a queue of
failed tasks, an id that cannot be a task's (short ids are resolved once the stores are open:
short_id_args.py).  One line, exit status 2 (a UsageError); main thread."""

from __future__ import annotations

import argparse
from collections.abc import Collection

from ..backends import INDEXED
from ..backends.azure_common import failed_queue_of
from ..core.options import UsageError
from ..core.settings import Settings
from ..core.task import id_problem, is_made_id
from ..ops.short_ids import may_be_prefix


def refuse_before_opening(ns: argparse.Namespace, settings: Settings) -> None:
    """UsageError for what ``ns`` asks that no queue could do."""
    if ns.command == "push":
        refuse_failed_queue(settings)
    ids = list(getattr(ns, "ids", None) or ()) + ([ns.id] if getattr(ns, "id", None) else [])
    if ns.command in ("cancel", "requeue", "logs", "result"):
        refuse_bad_ids(ns.command, ids, settings.backend not in INDEXED
                       and ns.command == "cancel" and not ns.any_id, short_later=True)


def refuse_failed_queue(settings: Settings) -> None:
    """``--queue`` names a queue where failed tasks are recorded: a pushed task would be read
    as a failure record and never run."""
    base = failed_queue_of(settings.backend, settings.queue)
    if base is not None:
        raise UsageError(f"push: {settings.queue} is where the failed tasks of queue {base} "
                         f"are recorded, not a task queue (push to {base}; jobq-ctl requeue "
                         f"brings failed tasks back)")


def refuse_bad_ids(command: str, ids: list[str], made_only: bool,
                   short_later: bool = False) -> None:
    """An id no task can have; with ``made_only`` (a cancel on Azure, which has no index of
    task ids to look one up in and would record any string; SQLite and PostgreSQL say "no
    task", exit 1) also one no producer makes -- but with ``short_later`` for a possible short
    id, checked once resolved (short_id_args.resolve_ids)."""
    for task_id in ids:
        problem = id_problem(task_id)
        if problem is not None:
            raise UsageError(f"{command}: {task_id[:40]!r} is not a task id: {problem}")
        if made_only and not is_made_id(task_id) and not (short_later
                                                          and may_be_prefix(task_id)):
            raise UsageError(f"{command}: {task_id[:40]!r} is not a task id (jobq-ctl and "
                             f"ai4s-jobq make 32 hex digits, as push prints them); nothing "
                             f"cancelled (--any-id: the id of a hand-written body)")


def refuse_short_config(argv: list[str], commands: Collection[str]) -> None:
    """``-c`` before the command: jobq-ctl's ``-c`` is push's command, not the config file
    (jobq-supervisor's); say which option it is instead of "invalid choice"."""
    for arg in argv:
        if arg in commands:
            return
        if arg == "-c" or (arg.startswith("-c") and not arg.startswith("--")):
            raise UsageError("-c: on jobq-ctl, -c is push's command (push -c CMD); give the "
                             "config file as --config FILE, before or after the command")
