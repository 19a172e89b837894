"""A follower's world for the unit tests of ``jobq-ctl logs -f`` and ``push --wait/--follow``:
the real stores (FileOutputStore, SqliteControlStore) on disk and an EventClock, so that the
records and output a worker writes are scripted at fake times and nothing sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from supervisor.fleet.control.records import ResultRecord
from supervisor.fleet.control.sqlite import SqliteControlStore
from supervisor.fleet.output.base import AttemptKey
from supervisor.fleet.output.files import FileOutputStore
from supervisor.ops.follow import Sources
from tests.fakes.clock import EventClock

Q = "jobs"


def follow_world(tmp_path: Path) -> Iterator[SimpleNamespace]:
    """(a fixture's body) ``fake`` (the EventClock), ``out`` and ``control`` (the stores),
    ``jobs`` (task id -> the queue's status of it) and ``src`` (the follower's Sources)."""
    fake = EventClock()
    out_store = FileOutputStore(str(tmp_path / "out"))
    control = SqliteControlStore(str(tmp_path / "q.db"))
    jobs: dict[str, str] = {}
    src = Sources(Q, out_store, control, lambda ids: {i: jobs[i] for i in ids if i in jobs},
                  fake.clock())
    yield SimpleNamespace(fake=fake, out=out_store, control=control, jobs=jobs, src=src)
    control.close()


def result(task: str, attempt: int, outcome: str, final: bool, exit_status=None, signal=None,
           cancelled_by: str = "", reason: str = "") -> ResultRecord:
    """A result record of queue ``Q`` as a worker on vm1 writes it."""
    return ResultRecord(queue=Q, task_id=task, attempt=attempt, outcome=outcome, reason=reason,
                        tail="", exit_status=exit_status, worker="vm1:1:aa", when=1.0e9,
                        signal=signal, started=1.0e9, finished=None if outcome == "running"
                        else 1.0e9, final=final, cancelled_by=cancelled_by)


def key(task: str, attempt: int) -> AttemptKey:
    return AttemptKey(Q, task, attempt)


def ns(task: str, **kw) -> SimpleNamespace:
    """The parsed arguments of ``jobq-ctl logs TASK`` (``kw`` overrides)."""
    base = {"id": task, "attempt": None, "all": False, "follow": False, "tail": None}
    base.update(kw)
    return SimpleNamespace(**base)
