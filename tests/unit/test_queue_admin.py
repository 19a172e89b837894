"""The queue-admin capability (``Backend.admin()``, issue 27) on real SQLite files in
tmp_path: what jobq-ctl and the dashboard ask of a queue that indexes its tasks by id, and
the several-queues backend forwarding it."""

from __future__ import annotations

import time

import pytest

from supervisor.backends.base import BackendBase
from supervisor.backends.multi import MultiQueueBackend
from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.task import Task

pytestmark = pytest.mark.timeout(30)


def test_sqlite_answers_states_detail_cancels_and_counts(tmp_path, close_at_end) -> None:
    backend = close_at_end(SqliteBackend(str(tmp_path / "q.db"), "default", "w1"))
    pending, running = Task(cmd="echo a"), Task(cmd="echo b")
    backend.push([pending, running])
    [lease] = backend.receive(1, 60.0)
    assert lease.task is not None and lease.task.id == pending.id  # push order
    pending, running = running, pending  # the received one runs, the other waits
    admin = backend.admin()
    assert admin is not None
    assert admin.task_states([pending.id, running.id, "0" * 32]) == {
        pending.id: "pending", running.id: "running"}
    detail = admin.task_detail(running.id)
    assert detail is not None
    assert (detail.status, detail.attempt, detail.worker) == ("running", 1, "w1")
    assert Task.parse(detail.body).id == running.id and detail.locked_until is not None
    assert admin.task_detail("0" * 32) is None
    assert admin.cancelled_count() == 0
    # only a pending task is taken off the queue; a running one is its worker's to stop
    taken = admin.cancel_pending([pending.id, running.id], "cancelled by op", time.time())
    assert taken == {pending.id}
    assert admin.task_states([pending.id]) == {pending.id: "failed"}
    assert admin.cancelled_count() == 1
    assert admin.take_back([running.id]) == {}  # its worker (this process) is alive
    assert backend.requeue_chunk == 500


def test_several_queues_forward_to_each(tmp_path, close_at_end) -> None:
    path = str(tmp_path / "q.db")
    high = SqliteBackend(path, "high", "w1")
    low = SqliteBackend(path, "low", "w1")
    multi = close_at_end(MultiQueueBackend({"high": high, "low": low}))
    a, b = Task(cmd="echo a"), Task(cmd="echo b")
    high.push([a])
    low.push([b])
    admin = multi.admin()
    assert admin is not None
    assert admin.task_states([a.id, b.id]) == {a.id: "pending", b.id: "pending"}
    detail = admin.task_detail(b.id)
    assert detail is not None and detail.status == "pending"
    assert admin.cancel_pending([a.id, b.id], "cancelled by op", time.time()) == {a.id, b.id}
    assert admin.cancelled_count() == 2


def test_a_queue_without_an_index_has_no_admin() -> None:
    """The default: the Azure backends keep none (callers fall back on the control store)."""
    assert BackendBase().admin() is None
    assert BackendBase.requeue_chunk is None
