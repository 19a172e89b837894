"""``jobq-ctl result ID [--json]``: the result records of a task's attempts (main thread).

Each attempt of a task has one record in the control store, written by the worker that ran
it when the attempt starts (``running``) and again when it ends (results.py; see
docs/architecture.rst, "The fleet layer").  One range query (``results_of``); the backend is
not asked (but on SQLite, for a task with a cancel, its job row).  Exit statuses: 0 with
records, 1 for a task without any (unknown, not started yet, or purged after 7 days) and for
a store that cannot be reached, 2 without a store.

An attempt's record stays ``running`` when its worker died (SIGKILL, a lost VM) before it
wrote the end.  Readers show such an attempt as ``worker-lost`` (``shown_state``): its worker
record is gone or its heartbeat stale, or a later attempt of the task has a record, so it
cannot still be running.  A task cancelled before an attempt ran shows that attempt as
``cancelled`` (derived from its cancel record, task_ends.py), not as no result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..backends.base import Backend
from ..fleet.control.base import HEARTBEAT_INTERVAL, LOST_AFTER, ControlStore, worker_states
from ..fleet.control.records import ResultRecord
from ..ops.task_ends import read_pending_cancel
from . import fleet_commands as ctl_fleet
from .fleet_commands import EXIT_NOT_FOUND, duration_text
from .queue_commands import iso, iso_or_none

# A running record this young whose worker has no record may belong to a worker whose first
# heartbeat is not written yet (it and the first result go out on the control thread).
LOST_GRACE = LOST_AFTER * HEARTBEAT_INTERVAL


def shown_state(r: ResultRecord, workers: Mapping[str, str] | None, now: float,
                superseded: bool = False) -> str:
    """The attempt's state as readers show it: ``worker-lost`` for a ``running`` record
    that a later attempt ``superseded``, or whose worker is lost, or has no record (deleted
    at its exit, purged) past ``LOST_GRACE``; ``workers``: the queue's, from
    ``control.base.worker_states`` (None: not known) (any thread)."""
    if r.outcome == "running" and superseded:
        return "worker-lost"  # a later attempt started: this one's lease was taken back
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


def result_json(r: ResultRecord, now: float, workers: Mapping[str, str] | None = None,
                superseded: bool = False) -> dict[str, Any]:
    """One attempt as ``--json`` prints it (times in ISO-8601 UTC, like every JSON output);
    ``workers``, ``superseded``: as ``shown_state`` takes them."""
    state = shown_state(r, workers, now, superseded)
    d = _duration(r, now, state)
    return {"task_id": r.task_id, "attempt": r.attempt, "max_attempts": r.max_attempts,
            "state": state, "final": r.final, "exit_status": r.exit_status,
            "signal": r.signal, "worker": r.worker, "started": iso_or_none(r.started),
            "finished": iso_or_none(r.finished),
            "duration_s": None if d is None else round(d, 3), "reason": r.reason,
            "cancelled_by": r.cancelled_by or None}


def results_json(records: Sequence[ResultRecord], now: float,
                 workers: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """Every attempt of a task (``records``: by attempt) as ``--json`` prints them; the
    dashboard's task page shows the same."""
    last = max((r.attempt for r in records), default=0)
    return [result_json(r, now, workers, r.attempt < last) for r in records]


def task_results(store: ControlStore, queue: str, task_id: str,
                 job: Callable[[], str | None]) -> list[ResultRecord]:
    """The task's result records, and the derived end of a cancel that came before an
    attempt ran (task_ends.py); ``job``: its SQLite job status ("?" elsewhere).  Raises
    ControlStoreError (the caller's thread)."""
    records = store.results_of(queue, task_id)
    cancel = read_pending_cancel(store, queue, task_id, records, job, ctl_fleet.clock())
    return records + [cancel] if cancel is not None else records


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
    if backend is None or backend.name != "sqlite":
        return lambda: "?"

    def status() -> str | None:
        from ..backends.sqlite.admin import task_states

        return task_states(backend, [task_id]).get(task_id)  # type: ignore[arg-type]
    return status


def cmd_result(ns: Any, backend: Backend | None, store: ControlStore) -> int:
    records = task_results(store, ns.queue, ns.id, _job(backend, ns.id))
    if not records:
        print(f"jobq-ctl: error: result: no result recorded for task {ns.id!r} in queue "
              f"{ns.queue} (not started yet, unknown, or older than 7 days)", file=sys.stderr)
        return EXIT_NOT_FOUND
    now = ctl_fleet.clock()
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
        took = _took(_duration(r, now, state))
        print(f"{of:>7}  {state:11}  {_status(r):10}  {r.worker:30}  {iso(r.started):20}  "
              f"{iso(r.finished):20}  {took:>7}  {_detail(r, later.get(r.attempt))}".rstrip())
    return 0
