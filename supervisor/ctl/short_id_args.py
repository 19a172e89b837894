"""Short task ids on ``jobq-ctl``'s command line (``logs``, ``result``, ``cancel``, ``requeue``):
each replaced by the task id it is a unique prefix of, on the clients the command opened
(ops/short_ids.py), before its handler runs.  Imported only by those commands (commands.py).
Main thread."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..backends import INDEXED, open_backend
from ..backends.base import QueueAdmin
from ..core.options import UsageError
from ..core.settings import Settings
from ..fleet.control.base import ControlStore
from ..fleet.output.base import OutputStore
from ..ops.short_ids import AmbiguousId, may_be_prefix, resolve
from .clients import Clients
from .guards import refuse_bad_ids

Handler = Callable[[argparse.Namespace, Clients], int]


def with_short_ids(handler: Handler) -> Handler:
    """``handler`` on the ids as resolved from short ids, on what the command opened: the
    queue's index where it has one, the control and output stores."""
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


def resolve_ids(ns: argparse.Namespace, settings: Settings, admin: QueueAdmin | None,
                store: ControlStore | None, output: OutputStore | None) -> None:
    """Replace each short id of ``ns`` (``id``, ``ids``) by the task id it is a unique
    prefix of (ops/short_ids.py, on what the command opened); AmbiguousId (exit 2) for a
    prefix several ids start with; an id matching nothing stays, for the command's own
    "no task".  Then the made-id check of an Azure cancel, on the ids as resolved."""
    def one(text: str) -> str:
        try:
            return resolve(text, settings.queue, admin, store, output)
        except AmbiguousId as exc:
            raise UsageError(f"{ns.command}: {exc}") from None

    if getattr(ns, "id", None):
        ns.id = one(ns.id)
    if getattr(ns, "ids", None):
        ns.ids = [one(i) for i in ns.ids]
    if ns.command == "cancel" and settings.backend not in INDEXED and not ns.any_id:
        refuse_bad_ids("cancel", list(ns.ids), True)
