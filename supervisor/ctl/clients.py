"""What each ``jobq-ctl`` command opens before it runs (main thread): the backend (read-only
commands open it with ``create=False``), the control store (a fleet command without one is
exit 2; status, requeue and failed go on without one), and for ``logs`` and ``push
--wait/--follow`` the output store and the result records (``sources.open_sources``), each
before anything is done, so that a configuration that cannot work is exit 2 with nothing
pushed.  The stores' modules (stores.py, sources.py) are imported only for a command that opens
one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backends import INDEXED, open_backend
from ..backends.base import Backend
from ..core.settings import Settings

if TYPE_CHECKING:
    from ..fleet.control.base import ControlStore
    from ..ops.follow import Sources

# Sub-commands that only look: they open the backend with create=False, so a mistyped queue
# or path is "does not exist" (exit 1) instead of a new, empty queue and "0".
READ_ONLY_COMMANDS = frozenset({"size", "peek", "status", "failed", "workers", "logs",
                                "result", "tasks", "actions"})
# Sub-commands that look at one queue: a queue the backend does not know is "does not
# exist" (exit 1), not an empty queue (Backend.require_queue).
QUEUE_VIEWS = frozenset({"size", "peek", "status", "failed", "tasks"})
# Sub-commands that go on without a control store (see open_store); clear and prune only
# keep their audit record in it (ctl/actions_command.py).
STORE_OPTIONAL = ("status", "requeue", "failed", "tasks", "clear", "prune")
FLEET_COMMANDS = frozenset({"workers", "cancel", "pause", "resume", "drain", "stop", "result",
                            "actions"})
# Fleet commands that ask the queue where it tells (``Backend.admin``): cancel takes a pending
# task off it, result reads whether the cancel took the task.
ASKS_QUEUE = frozenset({"cancel", "result"})


@dataclass
class Clients:
    """What one command runs on; None where it needs none (or none is configured)."""

    settings: Settings
    backend: Backend | None = None
    store: ControlStore | None = None
    sources: Sources | None = None  # logs, push --wait/--follow: output and results

    def queue(self) -> Backend:
        """The backend of a command that always opens one (``needs_backend``)."""
        assert self.backend is not None
        return self.backend

    def control(self) -> ControlStore:
        """The control store of a fleet command (``stores.open_store`` refused to go on
        without)."""
        assert self.store is not None
        return self.store

    def close(self) -> None:
        for thing in (self.store, self.backend, self.sources):
            if thing is not None:
                thing.close()


def needs_backend(command: str, settings: Settings) -> bool:
    """The queue commands and status need the backend; the fleet ones on SQLite (to check
    the database), and cancel and result on every queue that indexes its tasks (the task
    ids, a pending task taken off the queue)."""
    return (command not in FLEET_COMMANDS or settings.backend == "sqlite"
            or (command in ASKS_QUEUE and settings.backend in INDEXED))


def open_clients(ns: argparse.Namespace, settings: Settings) -> Clients:
    """Everything ``ns.command`` runs on, opened in order (a failure closes what was opened
    and raises: UsageError, the backends' and stores' errors)."""
    clients = Clients(settings)
    takes_store = ns.command in FLEET_COMMANDS or ns.command in STORE_OPTIONAL
    unique = ns.command == "push" and (ns.unique or ns.unique_key is not None)
    wants_sources = ns.command == "logs" or (ns.command == "push" and (ns.wait or ns.follow))
    # the stores' modules (records, output, follower) only for a command that opens one
    if takes_store or unique:
        from . import stores
    if wants_sources:
        from . import sources
    try:
        if needs_backend(ns.command, settings):
            clients.backend = open_backend(settings, for_ctl=True,
                                           create=ns.command not in READ_ONLY_COMMANDS)
            if ns.command in QUEUE_VIEWS:
                clients.backend.require_queue()
        if takes_store:
            clients.store = stores.open_store(ns.command, settings,
                                              ns.command not in READ_ONLY_COMMANDS,
                                              ns.command in STORE_OPTIONAL)
        elif unique and clients.backend is not None and clients.backend.unique_by_control:
            # None: push_schedule says why (exit 2)
            clients.store = stores.open_control_store(settings)
        if wants_sources:
            clients.sources = sources.open_sources(ns, settings, clients.backend)
    except BaseException:
        clients.close()
        raise
    return clients
