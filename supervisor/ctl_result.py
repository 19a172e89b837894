"""``jobq-ctl result ID [--json]``: the result records of a task's attempts (main thread).

Each attempt of a task has one record in the control store, written by the worker that ran
it when the attempt starts (``running``) and again when it ends (results.py; see
docs/architecture.rst, "The fleet layer").  One range query (``results_of``); the backend is
not asked.  Exit statuses: 0 with records, 1 for a task without any (unknown, not started
yet, or purged after 7 days) and for a store that cannot be reached, 2 without a store.

An attempt's record stays ``running`` when its worker died (SIGKILL, a lost VM) before it
wrote the end.  Readers show such an attempt as ``worker-lost`` (``shown_state``): its worker
record is gone or its heartbeat stale, so it cannot still be running.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from . import ctl_fleet
from .backends.base import Backend
from .control.base import HEARTBEAT_INTERVAL, LOST_AFTER, ControlStore, worker_states
from .control.records import ResultRecord
from .ctl import iso, iso_or_none
from .ctl_fleet import EXIT_NOT_FOUND, duration_text

# A running record this young whose worker has no record may belong to a worker whose first
# heartbeat is not written yet (it and the first result go out on the control thread).
LOST_GRACE = LOST_AFTER * HEARTBEAT_INTERVAL


def shown_state(r: ResultRecord, workers: Mapping[str, str] | None, now: float) -> str:
    """The attempt's state as readers show it: ``worker-lost`` for a ``running`` record whose
    worker is lost, or has no record (deleted at its exit, purged) past ``LOST_GRACE``;
    ``workers``: the queue's, from ``control.base.worker_states`` (None: not known, shown as
    stored) (any thread)."""
    if r.outcome != "running" or workers is None:
        return r.outcome
    state = workers.get(r.worker)
    if state == "lost" or (state is None and now - r.when > LOST_GRACE):
        return "worker-lost"
    return r.outcome


def _duration(r: ResultRecord, now: float, state: str) -> float | None:
    if r.started is None or state == "worker-lost":  # its end is not known
        return None
    return max(0.0, (r.finished if r.finished is not None else now) - r.started)


def result_json(r: ResultRecord, now: float,
                workers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One attempt as ``--json`` prints it (times in ISO-8601 UTC, like every JSON output);
    ``workers``: as ``shown_state`` takes them."""
    state = shown_state(r, workers, now)
    d = _duration(r, now, state)
    return {"task_id": r.task_id, "attempt": r.attempt, "max_attempts": r.max_attempts,
            "state": state, "final": r.final, "exit_status": r.exit_status,
            "signal": r.signal, "worker": r.worker, "started": iso_or_none(r.started),
            "finished": iso_or_none(r.finished),
            "duration_s": None if d is None else round(d, 3), "reason": r.reason,
            "cancelled_by": r.cancelled_by or None}


def _status(r: ResultRecord) -> str:
    if r.signal is not None:
        return f"signal {r.signal}"
    if r.exit_status is not None:
        return f"exit {r.exit_status}"
    return "-"


def _took(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 60 else duration_text(seconds)


def _detail(r: ResultRecord) -> str:
    parts = ["final"] if r.final else []
    if r.cancelled_by:
        parts.append(f"cancelled by {r.cancelled_by}")
    if r.reason:
        parts.append(r.reason)
    return "; ".join(parts)


def cmd_result(ns: Any, backend: Backend | None, store: ControlStore) -> int:
    records = store.results_of(ns.queue, ns.id)
    if not records:
        print(f"jobq-ctl: error: result: no result recorded for task {ns.id!r} in queue "
              f"{ns.queue} (not started yet, unknown, or older than 7 days)", file=sys.stderr)
        return EXIT_NOT_FOUND
    now = ctl_fleet.clock()
    workers = worker_states(store.workers(ns.queue), now)
    if ns.json:
        print(json.dumps([result_json(r, now, workers) for r in records], indent=2))
        return 0
    print(f"task {ns.id} on queue {ns.queue}")
    print(f"{'ATTEMPT':>7}  {'STATE':11}  {'STATUS':10}  {'WORKER':30}  {'STARTED':20}  "
          f"{'FINISHED':20}  {'TOOK':>7}  DETAIL")
    for r in records:
        of = f"{r.attempt}/{r.max_attempts}" if r.max_attempts else str(r.attempt)
        state = shown_state(r, workers, now)
        took = _took(_duration(r, now, state))
        print(f"{of:>7}  {state:11}  {_status(r):10}  {r.worker:30}  {iso(r.started):20}  "
              f"{iso(r.finished):20}  {took:>7}  {_detail(r)}".rstrip())
    return 0
