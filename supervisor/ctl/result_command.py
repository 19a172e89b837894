"""``jobq-ctl result ID [--json]``: the result records of a task's attempts, printed (main
thread; what they are and how an attempt's state is shown: ops/results.py).  Exit statuses:
0 with records, 1 for a task without any (unknown, not started yet, or purged after 7 days)
and for a store that cannot be reached, 2 without a store.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from ..backends.base import Backend
from ..fleet.control.base import ControlStore, worker_states
from ..fleet.control.records import ResultRecord
from ..ops import fleet
from ..ops.results import attempt_duration, results_json, shown_state, task_results
from ..ops.times import duration_text, iso
from .fleet_commands import EXIT_NOT_FOUND


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


def _detail(r: ResultRecord, again: int | None = None) -> str:
    """The DETAIL column; ``again``: the attempt that ran after this one, said for a
    ``lock-lost`` attempt -- it may have run to its end (its settlement did not happen) and
    the task ran a second time."""
    parts = ["final"] if r.final else []
    if r.cancelled_by and not r.reason.startswith("cancelled by"):  # said once
        parts.append(f"cancelled by {r.cancelled_by}")
    if r.reason:
        parts.append(r.reason)
    if again is not None and r.outcome == "lock-lost":
        parts.append(f"ran again as attempt {again}")
    return "; ".join(parts)


def _job(backend: Backend | None, task_id: str) -> Callable[[], str | None]:
    admin = backend.admin() if backend is not None else None
    if admin is None:
        return lambda: "?"
    return lambda: admin.task_states([task_id]).get(task_id)


def cmd_result(ns: argparse.Namespace, backend: Backend | None, store: ControlStore) -> int:
    records = task_results(store, ns.queue, ns.id, _job(backend, ns.id))
    if not records:
        print(f"jobq-ctl: error: result: no result recorded for task {ns.id!r} in queue "
              f"{ns.queue} (not started yet, unknown, or older than 7 days)", file=sys.stderr)
        return EXIT_NOT_FOUND
    now = fleet.clock()
    workers = worker_states(store.workers(ns.queue), now)
    if ns.json:
        print(json.dumps(results_json(records, now, workers), indent=2))
        return 0
    print(f"task {ns.id} on queue {ns.queue}")
    print(f"{'ATTEMPT':>7}  {'STATE':11}  {'STATUS':10}  {'WORKER':30}  {'STARTED':20}  "
          f"{'FINISHED':20}  {'TOOK':>7}  DETAIL")
    last = records[-1].attempt
    later = {r.attempt: n.attempt for r, n in zip(records, records[1:])}
    for r in records:
        of = f"{r.attempt}/{r.max_attempts}" if r.max_attempts else str(r.attempt)
        state = shown_state(r, workers, now, r.attempt < last)
        took = _took(attempt_duration(r, now, state))
        print(f"{of:>7}  {state:11}  {_status(r):10}  {r.worker:30}  {iso(r.started):20}  "
              f"{iso(r.finished):20}  {took:>7}  {_detail(r, later.get(r.attempt))}".rstrip())
    return 0
