"""The dashboard's several queues (``jobq-ctl dashboard --queue high,default,low``): one
DataSource per queue (each with its per-thread clients), a request's queue from its
``?queue=NAME`` parameter (none: the first queue, so single-queue URLs keep working), and the
overview's per-queue rows.  Every function runs on a request thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from flask import abort, request

from ..ops.fleet import StatusJson
from ..ops.short_ids import AmbiguousId
from .data import DataSource, FlagJson, Unavailable, count_states


class QueueRow(TypedDict):
    """One queue on the overview: its status (None and ``error`` when it cannot be read),
    cancelled count (where the queue tells) and pause flag."""

    name: str
    status: StatusJson | None
    error: str | None
    cancelled: int | None
    flag: FlagJson | None


class Queues:
    """The served queues in ``--queue`` order; the first is the default."""

    def __init__(self, sources: Sequence[DataSource]) -> None:
        self.sources = {d.queue: d for d in sources}
        self.names = [d.queue for d in sources]

    @property
    def several(self) -> bool:
        return len(self.names) > 1

    def get(self, name: str | None) -> DataSource:
        """The named queue's DataSource (None: the first); 404 for one not served here."""
        if not name:
            return self.sources[self.names[0]]
        found = self.sources.get(name)
        if found is None:
            abort(404, f"queue {name[:60]!r} is not served by this dashboard "
                       f"(--queue {','.join(self.names)})")
        return found

    def current(self) -> DataSource:
        """This request's queue (``?queue=``, in the query string for a POST too)."""
        return self.get(request.args.get("queue"))

    def status_json(self) -> dict[str, StatusJson | None]:
        """What ``jobq-ctl status --queue a,b --json`` prints: queue name -> that queue's
        status, null for a queue that cannot be read."""
        out: dict[str, StatusJson | None] = {}
        for name in self.names:
            try:
                out[name] = self.sources[name].status()
            except Unavailable:
                out[name] = None
        return out

    def rows(self) -> list[QueueRow]:
        """The overview's table: per queue its status (None and ``error`` when the queue is
        down), cancelled count and pause flag."""
        rows = []
        for name in self.names:
            d = self.sources[name]
            row: QueueRow = {"name": name, "status": None, "error": None,
                             "cancelled": None, "flag": None}
            try:
                row["status"] = d.status()
                row["cancelled"] = d.cancelled()
            except Unavailable as exc:
                row["error"] = exc.text
            rows.append(row)
        return rows

    def fleet(self) -> tuple[dict[str, int], dict[str, FlagJson | None]]:
        """(workers by state over every queue, each queue's pause flag); Unavailable when the
        control store cannot be read."""
        listings, flags = [], {}
        for name in self.names:
            states, flags[name] = self.sources[name].fleet_states()
            listings.append(states)
        return count_states(listings), flags

    def resolve_id(self, text: str, first: DataSource) -> str:
        """The task id ``text`` names (a whole id, or a unique prefix: DataSource.resolve_id)
        on the first queue, asking ``first`` first, that knows one; ``text`` when none does.
        A prefix ambiguous on a queue is a 400 page naming the candidates."""
        for d in [first] + [d for d in self.sources.values() if d is not first]:
            try:
                found = d.resolve_id(text)
            except AmbiguousId as exc:
                abort(400, str(exc))
            except Unavailable:
                continue
            if found != text:
                return found
        return text

    def find_task(self, task_id: str, first: DataSource) -> DataSource | None:
        """The queue that knows ``task_id``, asking ``first`` (the page's queue) first: the
        backend's row (SQLite) or the control store's results and running tasks (Azure)."""
        for d in [first] + [d for d in self.sources.values() if d is not first]:
            try:
                if d.task(task_id) is not None:
                    return d
            except Unavailable:
                continue
        return None
