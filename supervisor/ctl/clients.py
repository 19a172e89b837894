"""What each ``jobq-ctl`` command opens before it runs (main thread): the backend (read-only
commands open it with ``create=False``), the control store (a fleet command without one is
exit 2; status, requeue and failed go on without one), and for ``logs`` and ``push
--wait/--follow`` the output store and the result records (``open_sources``), each before
anything is done, so that a configuration that cannot work is exit 2 with nothing pushed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..backends import open_backend
from ..backends.base import Backend
from ..core.options import UsageError
from ..core.settings import Settings
from ..fleet.control.base import ControlStore, ControlStoreError
from ..fleet.control.open import open_control_store
from ..fleet.output.open import open_output_pushes, open_output_store
from ..ops.follow import Sources

# Sub-commands that only look: they open the backend with create=False, so a mistyped queue
# or path is "does not exist" (exit 1) instead of a new, empty queue and "0".
READ_ONLY_COMMANDS = frozenset({"size", "peek", "status", "failed", "workers", "logs",
                                "result"})
# Sub-commands that look at one queue: a queue the backend does not know is "does not
# exist" (exit 1), not an empty queue (Backend.require_queue).
QUEUE_VIEWS = frozenset({"size", "peek", "status", "failed"})
FLEET_COMMANDS = frozenset({"workers", "cancel", "pause", "resume", "drain", "stop", "result"})
# s per blob call: with start-up, an unreachable (black-holed) store is exit 1 within 10 s
READ_TIMEOUT = 5.0


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
        """The control store of a fleet command (``open_store`` refused to go on without)."""
        assert self.store is not None
        return self.store

    def close(self) -> None:
        for thing in (self.store, self.backend, self.sources):
            if thing is not None:
                thing.close()


def needs_backend(command: str, settings: Settings) -> bool:
    """The queue commands and status need the backend; the fleet ones only on SQLite (to
    check the database and, for cancel, the task ids)."""
    return command not in FLEET_COMMANDS or settings.backend == "sqlite"


def _no_store(command: str, settings: Settings) -> str:
    if settings.control == "off":
        return f"{command}: the control store is off (--control off); use --control auto"
    if settings.backend == "servicebus":
        return (f"{command}: no control store: Service Bus has no storage account; set "
                f"--control-account-url or --control-connection-string (env "
                f"JOBQ_CONTROL_CONNECTION_STRING)")
    return (f"{command}: no control store: the table endpoint of this account is not known; "
            f"set --control-account-url or --control-connection-string")


def open_store(command: str, settings: Settings) -> ControlStore | None:
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


def open_sources(ns: argparse.Namespace, settings: Settings, backend: Backend | None
                 ) -> Sources:
    """The stores ``logs`` or ``push --wait/--follow`` read; before a push, so that a
    configuration that cannot work is exit 2 with nothing pushed.  ``push --wait`` on a
    queue that tells its tasks' states (``Backend.admin``: SQLite) works without a control
    store (``--control off``): the rows' status ends the wait."""
    name = "logs" if ns.command == "logs" else "push --follow" if ns.follow else "push --wait"
    admin = backend.admin() if backend is not None else None
    jobs = admin.task_states if admin is not None else None
    needs_output = ns.command == "logs" or ns.follow
    if settings.control == "off" and jobs is not None and not needs_output:
        return Sources(settings.queue, None, None, jobs)
    control = open_store(name, settings)  # None is a UsageError: which option to set
    assert control is not None
    try:
        output = (open_output_store(settings, create=False, read_timeout=READ_TIMEOUT)
                  if needs_output else None)
    except BaseException:
        control.close()
        raise
    if needs_output and output is None:
        control.close()
        raise UsageError(f"{name}: no output store: task output is kept beside the control "
                         "store (SQLite: files beside the database; PostgreSQL: tables in "
                         "its schema; Azure: blob container --task-log-container in the "
                         "account of --control-account-url or --control-connection-string)")
    return Sources(settings.queue, output, control, jobs, pushes=open_output_pushes(settings))


def open_clients(ns: argparse.Namespace, settings: Settings) -> Clients:
    """Everything ``ns.command`` runs on, opened in order (a failure closes what was opened
    and raises: UsageError, the backends' and stores' errors)."""
    clients = Clients(settings)
    try:
        if needs_backend(ns.command, settings):
            clients.backend = open_backend(settings, for_ctl=True,
                                           create=ns.command not in READ_ONLY_COMMANDS)
            if ns.command in QUEUE_VIEWS:
                clients.backend.require_queue()
        if ns.command in FLEET_COMMANDS or ns.command in ("status", "requeue", "failed"):
            clients.store = open_store(ns.command, settings)
        elif (ns.command == "push" and (ns.unique or ns.unique_key is not None)
              and clients.backend is not None and clients.backend.unique_by_control):
            # None: push_schedule says why (exit 2)
            clients.store = open_control_store(settings)
        if ns.command == "logs" or (ns.command == "push" and (ns.wait or ns.follow)):
            clients.sources = open_sources(ns, settings, clients.backend)
    except BaseException:
        clients.close()
        raise
    return clients
