"""The result records of a task's attempts as an operator reads them (``jobq-ctl result``,
ctl/result_command.py; the dashboard's task page): any thread.

Each attempt of a task has one record in the control store, written by the worker that ran
it when the attempt starts (``running``) and again when it ends (worker/result_log.py; see
docs/architecture.rst, "The fleet layer").  One range query (``results_of``); the backend is
not asked (but where it indexes its tasks, ``Backend.admin``, for a task with a cancel, its
row's state).

An attempt's record stays ``running`` when its worker died (SIGKILL, a lost VM) before it
wrote the end.  Readers show such an attempt as ``worker-lost`` (``shown_state``): its worker
record is gone or its heartbeat stale, or a later attempt of the task has a record, so it
cannot still be running.  A task cancelled before an attempt ran shows that attempt as
``cancelled`` (derived from its cancel record, ops/task_ends.py), not as no result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypedDict

from ..core.signals import describe_exit
from ..fleet.control.base import HEARTBEAT_INTERVAL, LOST_AFTER, ControlStore
from ..fleet.control.records import ResultRecord
from . import fleet
from .task_ends import read_pending_cancel
from .times import iso_or_none

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


class ResultJson(TypedDict):
    """One attempt as ``jobq-ctl result --json`` prints it."""

    task_id: str
    attempt: int
    max_attempts: int | None
    state: str
    final: bool
    exit_status: int | None
    signal: int | None
    worker: str
    started: str | None
    finished: str | None
    duration_s: float | None
    reason: str
    cancelled_by: str | None


def attempt_duration(r: ResultRecord, now: float, state: str) -> float | None:
    """How long the attempt ran (so far, while it runs); None when not known."""
    if r.started is None or state == "worker-lost":  # its end is not known
        return None
    return max(0.0, (r.finished if r.finished is not None else now) - r.started)


def result_json(r: ResultRecord, now: float, workers: Mapping[str, str] | None = None,
                superseded: bool = False) -> ResultJson:
    """One attempt as ``--json`` prints it (times in ISO-8601 UTC, like every JSON output);
    ``workers``, ``superseded``: as ``shown_state`` takes them."""
    state = shown_state(r, workers, now, superseded)
    d = attempt_duration(r, now, state)
    return {"task_id": r.task_id, "attempt": r.attempt, "max_attempts": r.max_attempts,
            "state": state, "final": r.final, "exit_status": r.exit_status,
            "signal": r.signal, "worker": r.worker, "started": iso_or_none(r.started),
            "finished": iso_or_none(r.finished),
            "duration_s": None if d is None else round(d, 3), "reason": r.reason,
            "cancelled_by": r.cancelled_by or None}


def ended_text(exit_status: int | None, signal: int | None) -> str | None:
    """``killed by SIGTERM`` or ``exit status 3`` as the worker's log line words it
    (core/signals.describe_exit), not a shell's ``-15``; None when neither is known."""
    if signal is not None:
        return describe_exit(-signal)
    return None if exit_status is None else describe_exit(exit_status)


def results_json(records: Sequence[ResultRecord], now: float,
                 workers: Mapping[str, str] | None) -> list[ResultJson]:
    """Every attempt of a task (``records``: by attempt) as ``--json`` prints them; the
    dashboard's task page shows the same."""
    last = max((r.attempt for r in records), default=0)
    return [result_json(r, now, workers, r.attempt < last) for r in records]


def task_results(store: ControlStore, queue: str, task_id: str,
                 job: Callable[[], str | None]) -> list[ResultRecord]:
    """The task's result records, and the derived end of a cancel that came before an
    attempt ran (ops/task_ends.py); ``job``: its row's state ("?" where the queue cannot tell).
    Raises
    ControlStoreError (the caller's thread)."""
    records = store.results_of(queue, task_id)
    cancel = read_pending_cancel(store, queue, task_id, records, job, fleet.clock())
    return records + [cancel] if cancel is not None else records
