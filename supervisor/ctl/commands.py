"""The one dispatch table of ``jobq-ctl``: each sub-command's name -> its handler, called with
the parsed options and what clients.open_clients opened for it (main thread).  The handlers
print; what they read and do is ops/."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .actions_command import cmd_actions
from .clients import Clients
from .fleet_commands import (
    cmd_cancel,
    cmd_command,
    cmd_flag,
    cmd_status,
    cmd_workers,
)
from .migrate_command import cmd_migrate
from .output_commands import cmd_logs
from .queue_commands import cmd_clear, cmd_failed, cmd_peek, cmd_prune, cmd_push, cmd_requeue
from .result_command import cmd_result
from .tasks_command import cmd_tasks

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


COMMANDS: dict[str, Handler] = {
    "push": lambda ns, c: cmd_push(ns, c.queue(), c.sources, c.store),
    "logs": _logs,
    "size": _size,
    "status": lambda ns, c: cmd_status(ns, c.queue(), c.store),
    "peek": lambda ns, c: cmd_peek(ns, c.queue()),
    "failed": lambda ns, c: cmd_failed(ns, c.queue(), c.store),
    "tasks": lambda ns, c: cmd_tasks(ns, c.queue(), c.store),
    "requeue": lambda ns, c: cmd_requeue(ns, c.queue(), c.store),
    "clear": lambda ns, c: cmd_clear(ns, c.queue(), c.store),
    "prune": lambda ns, c: cmd_prune(ns, c.queue(), ns.retention, c.store),
    "workers": lambda ns, c: cmd_workers(ns, c.backend, c.control()),
    "cancel": lambda ns, c: cmd_cancel(ns, c.backend, c.control()),
    "pause": lambda ns, c: cmd_flag(ns, c.control(), True),
    "resume": lambda ns, c: cmd_flag(ns, c.control(), False),
    "drain": lambda ns, c: cmd_command(ns, c.control(), "drain"),
    "stop": lambda ns, c: cmd_command(ns, c.control(), "stop"),
    "result": lambda ns, c: cmd_result(ns, c.backend, c.control()),
    "actions": lambda ns, c: cmd_actions(ns, c.control()),
    "dashboard": _dashboard,  # it opens its clients per thread (supervisor/dashboard/)
    "migrate": lambda ns, c: cmd_migrate(ns, c.settings),  # PostgreSQL: its own connection
}
# Commands that open their own clients: open_clients opens nothing for them.
OPENS_OWN = frozenset({"dashboard", "migrate"})
