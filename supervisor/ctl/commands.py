"""The one dispatch table of ``jobq-ctl``: each sub-command's name -> its handler, called with
the parsed options and what clients.open_clients opened for it (main thread).  The handlers
print; what they read and do is ops/."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..backends import open_backend
from ..ops.short_ids import may_be_prefix
from .actions_command import cmd_actions
from .clients import Clients
from .fleet_commands import (
    cmd_cancel,
    cmd_command,
    cmd_flag,
    cmd_status,
    cmd_workers,
)
from .guards import resolve_ids
from .migrate_command import cmd_migrate
from .output_commands import cmd_logs
from .queue_commands import cmd_clear, cmd_failed, cmd_peek, cmd_prune, cmd_push, cmd_requeue
from .result_command import cmd_result
from .tasks_command import cmd_tasks
from .watch import watched

Handler = Callable[[argparse.Namespace, Clients], int]


def _size(ns: argparse.Namespace, c: Clients) -> int:
    print(c.queue().size())
    return 0


def _logs(ns: argparse.Namespace, c: Clients) -> int:
    assert c.sources is not None  # open_sources opened them, or refused
    return cmd_logs(ns, c.sources)


def _dashboard(ns: argparse.Namespace, c: Clients) -> int:
    from ..dashboard.serve import run  # only this command needs flask and waitress

    return run(ns, c.settings)


def _short_ids(handler: Handler) -> Handler:
    """``handler`` on the ids as resolved from short ids (guards.resolve_ids), on what the
    command opened: the queue's index where it has one, the control and output stores."""
    def run(ns: argparse.Namespace, c: Clients) -> int:
        src = c.sources
        backend, opened = c.backend, None
        ids = [ns.id] if getattr(ns, "id", None) else list(getattr(ns, "ids", None) or ())
        if backend is None and c.settings.backend == "postgres" and any(
                may_be_prefix(i) for i in ids):
            # logs runs on the stores alone; the jobs' id index is the one place that knows
            # every task of a PostgreSQL queue
            backend = opened = open_backend(c.settings, for_ctl=True, create=False)
        try:
            resolve_ids(ns, c.settings, backend.admin() if backend is not None else None,
                        c.store or (src.control if src is not None else None),
                        src.output if src is not None else None)
        finally:
            if opened is not None:
                opened.close()
        return handler(ns, c)
    return run


COMMANDS: dict[str, Handler] = {
    "push": lambda ns, c: cmd_push(ns, c.queue(), c.sources, c.store),
    "logs": _short_ids(_logs),
    "size": _size,
    "status": watched(lambda ns, c: cmd_status(ns, c.queue(), c.store)),
    "peek": lambda ns, c: cmd_peek(ns, c.queue()),
    "failed": lambda ns, c: cmd_failed(ns, c.queue(), c.store),
    "tasks": lambda ns, c: cmd_tasks(ns, c.queue(), c.store),
    "requeue": _short_ids(lambda ns, c: cmd_requeue(ns, c.queue(), c.store)),
    "clear": lambda ns, c: cmd_clear(ns, c.queue(), c.store),
    "prune": lambda ns, c: cmd_prune(ns, c.queue(), ns.retention, c.store),
    "workers": watched(lambda ns, c: cmd_workers(ns, c.backend, c.control())),
    "cancel": _short_ids(lambda ns, c: cmd_cancel(ns, c.backend, c.control())),
    "pause": lambda ns, c: cmd_flag(ns, c.control(), True),
    "resume": lambda ns, c: cmd_flag(ns, c.control(), False),
    "drain": lambda ns, c: cmd_command(ns, c.control(), "drain"),
    "stop": lambda ns, c: cmd_command(ns, c.control(), "stop"),
    "result": _short_ids(lambda ns, c: cmd_result(ns, c.backend, c.control())),
    "actions": lambda ns, c: cmd_actions(ns, c.control()),
    "dashboard": _dashboard,  # it opens its clients per thread (supervisor/dashboard/)
    "migrate": lambda ns, c: cmd_migrate(ns, c.settings),  # PostgreSQL: its own connection
}
# Commands that open their own clients: open_clients opens nothing for them.
OPENS_OWN = frozenset({"dashboard", "migrate"})
