"""The one dispatch table of ``jobq-ctl``: each sub-command's name -> the module of ctl/ that
holds its handler, the handler's name, and how it is called with the parsed options and what
clients.open_clients opened for it (main thread).  The handlers print; what they read and do
is ops/.

Only the module of the command that runs is imported (``handler``): a ``size`` or ``push``
does not pay for the control store's records, the output store, the follower or the
dashboard (start-up CPU, pinned by tests/integration/test_startup.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import import_module
from typing import TYPE_CHECKING, NamedTuple

from .watch import watched

if TYPE_CHECKING:
    from .clients import Clients

Handler = Callable[[argparse.Namespace, "Clients"], int]
Call = Callable[[Callable[..., int], argparse.Namespace, "Clients"], int]


class Entry(NamedTuple):
    module: str  # relative to this package (supervisor.ctl)
    name: str  # the handler in it
    call: Call  # how it is called
    watch: bool = False  # --watch repeats it (watch.py)
    short_ids: bool = False  # its task ids may be short ones (short_id_args.py)


def _size(ns: argparse.Namespace, c: Clients) -> int:
    print(c.queue().size())
    return 0


def _logs(fn: Callable[..., int], ns: argparse.Namespace, c: Clients) -> int:
    assert c.sources is not None  # open_sources opened them, or refused
    return fn(ns, c.sources)


COMMANDS: dict[str, Entry] = {
    "push": Entry(".push_command", "cmd_push",
                  lambda f, ns, c: f(ns, c.queue(), c.sources, c.store)),
    "logs": Entry(".output_commands", "cmd_logs", _logs, short_ids=True),
    "size": Entry(".commands", "_size", lambda f, ns, c: f(ns, c)),
    "status": Entry(".fleet_commands", "cmd_status", lambda f, ns, c: f(ns, c.queue(), c.store),
                    watch=True),
    "peek": Entry(".queue_commands", "cmd_peek", lambda f, ns, c: f(ns, c.queue())),
    "failed": Entry(".queue_commands", "cmd_failed", lambda f, ns, c: f(ns, c.queue(), c.store)),
    "tasks": Entry(".tasks_command", "cmd_tasks", lambda f, ns, c: f(ns, c.queue(), c.store)),
    "requeue": Entry(".queue_commands", "cmd_requeue",
                     lambda f, ns, c: f(ns, c.queue(), c.store), short_ids=True),
    "clear": Entry(".queue_commands", "cmd_clear", lambda f, ns, c: f(ns, c.queue(), c.store)),
    "prune": Entry(".queue_commands", "cmd_prune",
                   lambda f, ns, c: f(ns, c.queue(), ns.retention, c.store)),
    "workers": Entry(".fleet_commands", "cmd_workers",
                     lambda f, ns, c: f(ns, c.backend, c.control()), watch=True),
    "cancel": Entry(".fleet_commands", "cmd_cancel",
                    lambda f, ns, c: f(ns, c.backend, c.control()), short_ids=True),
    "pause": Entry(".fleet_commands", "cmd_flag", lambda f, ns, c: f(ns, c.control(), True)),
    "resume": Entry(".fleet_commands", "cmd_flag", lambda f, ns, c: f(ns, c.control(), False)),
    "drain": Entry(".fleet_commands", "cmd_command",
                   lambda f, ns, c: f(ns, c.control(), "drain")),
    "stop": Entry(".fleet_commands", "cmd_command", lambda f, ns, c: f(ns, c.control(), "stop")),
    "result": Entry(".result_command", "cmd_result",
                    lambda f, ns, c: f(ns, c.backend, c.control()), short_ids=True),
    "actions": Entry(".actions_command", "cmd_actions", lambda f, ns, c: f(ns, c.control())),
    # it opens its clients per thread (supervisor/dashboard/); only it needs flask and waitress
    "dashboard": Entry("..dashboard.serve", "run", lambda f, ns, c: f(ns, c.settings)),
    # PostgreSQL: its own connection
    "migrate": Entry(".migrate_command", "cmd_migrate", lambda f, ns, c: f(ns, c.settings)),
}
# Commands that open their own clients: open_clients opens nothing for them.
OPENS_OWN = frozenset({"dashboard", "migrate"})


def handler(command: str) -> Handler:
    """``command``'s handler, its module imported now (main thread)."""
    entry = COMMANDS[command]
    fn = getattr(import_module(entry.module, __package__), entry.name)

    def run(ns: argparse.Namespace, c: Clients) -> int:
        return entry.call(fn, ns, c)

    wrapped: Handler = run
    if entry.short_ids:
        from .short_id_args import with_short_ids  # only the commands that take task ids

        wrapped = with_short_ids(run)
    return watched(wrapped) if entry.watch else wrapped
