"""The control store a ``jobq-ctl`` command opens beside its queue (main thread): a fleet
command without one is exit 2; status, requeue, failed, tasks, clear and prune go on without
one.  Imported by clients.open_clients only for a command that opens one (start-up: a ``size``
or ``push`` does not import the control store's modules); sources.py opens the output store.
"""

from __future__ import annotations

import sys

from ..core.options import UsageError
from ..core.settings import Settings
from ..fleet.control.base import ControlStore, ControlStoreError
from ..fleet.control.open import open_control_store

__all__ = ["open_control_store", "open_store"]


def _no_store(command: str, settings: Settings) -> str:
    if settings.control == "off":
        return f"{command}: the control store is off (--control off); use --control auto"
    if settings.backend == "servicebus":
        return (f"{command}: no control store: Service Bus has no storage account; set "
                f"--control-account-url or --control-connection-string (env "
                f"JOBQ_CONTROL_CONNECTION_STRING)")
    return (f"{command}: no control store: the table endpoint of this account is not known; "
            f"set --control-account-url or --control-connection-string")


def open_store(command: str, settings: Settings, create: bool, optional: bool = False
               ) -> ControlStore | None:
    """The control store for ``command``.  A fleet command without one is a UsageError;
    status and requeue go on without one (``optional``: clients.STORE_OPTIONAL; status then
    shows its control part as unknown; requeue cannot clear the cancels of what it brings
    back, and says so; failed lists what the backend keeps; requeue, clear and prune keep no
    audit record)."""
    try:
        store = open_control_store(settings, create=create)
    except ControlStoreError as exc:
        if not optional:
            raise
        unkept = " (not kept in the audit log)" if command in ("requeue", "clear",
                                                                "prune") else ""
        print(f"jobq-ctl: warning: {exc}{unkept}", file=sys.stderr)
        return None
    if store is None and not optional:
        raise UsageError(_no_store(command, settings))
    return store
