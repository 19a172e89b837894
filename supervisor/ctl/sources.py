"""What ``jobq-ctl logs`` and ``push --wait/--follow`` read (main thread): the output store
and the result records (the control store, stores.py), opened before a push.  Imported by
clients.open_clients only for those commands (start-up: the output store's modules and the
follower are theirs alone).
"""

from __future__ import annotations

import argparse

from ..backends.base import Backend
from ..core.options import UsageError
from ..core.settings import Settings
from ..fleet.output.open import open_output_pushes, open_output_store
from ..ops.follow import Sources
from .stores import open_store

# s per blob call: with start-up, an unreachable (black-holed) store is exit 1 within 10 s
READ_TIMEOUT = 5.0


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
    # None is a UsageError: which option to set; logs only looks (clients.READ_ONLY_COMMANDS)
    control = open_store(name, settings, create=ns.command != "logs")
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
