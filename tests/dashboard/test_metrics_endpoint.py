"""Issue 30 point 3, the dashboard side: ``/metrics`` gives the fleet-wide gauges of every
served queue (depth, oldest pending age, running tasks, workers by state) in the Prometheus
text format, parsed back with prometheus-client's own parser (Flask test client, real SQLite
queue and control store; workers are records put as their control threads put them)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.backends import open_backend
from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.settings import Settings
from supervisor.core.task import Task
from supervisor.dashboard.app import create_app
from supervisor.dashboard.data import DataSource
from supervisor.fleet.control.open import open_control_store
from supervisor.fleet.control.records import WorkerRecord
from supervisor.fleet.control.sqlite import SqliteControlStore

pytestmark = pytest.mark.timeout(60)


def _record(wid: str, queue: str, now: float, state: str = "running",
            beat_age: float = 0.0) -> WorkerRecord:
    return WorkerRecord(id=wid, queue=queue, host="vm7", pid=4242, version="0.1.0",
                        state=state, slots_used=0, slots_total=2, started=now - 600,
                        heartbeat=now - beat_age, interval=15.0)


def _source(db: Path, queue: str) -> DataSource:
    settings = Settings(sqlite_path=str(db), queue=queue)
    return DataSource(queue, lambda: open_backend(settings, for_ctl=True),
                      lambda: open_control_store(settings))


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_fleet_gauges_of_every_queue(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    high = SqliteBackend(str(db), "high", "w-1", serve=True)
    low = SqliteBackend(str(db), "low", "w-2", serve=True)
    store = SqliteControlStore(str(db))
    try:
        high.push([Task(cmd="sleep 1"), Task(cmd="sleep 2"), Task(cmd="sleep 3")])
        (lease,) = high.receive(1, 600.0)  # one of them runs
        low.push([Task(cmd="true")])
        now = time.time()
        store.put_worker(_record("w-1", "high", now))
        store.put_worker(_record("w-3", "high", now, state="draining"))
        store.put_worker(_record("w-4", "high", now, beat_age=600))  # lost
        store.put_worker(_record("w-2", "low", now, state="paused"))
        app = create_app([_source(db, "high"), _source(db, "low")])
        resp = app.test_client().get("/metrics")
        assert resp.status_code == 200
        assert resp.content_type.startswith("text/plain; version=")
        got = _samples(resp.get_data(as_text=True))
    finally:
        store.close()
        low.close()
        high.close()

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert value("jobq_fleet_queue_up", queue="high") == 1
    assert value("jobq_fleet_queue_depth", queue="high") == 2  # pending: 3 pushed, 1 running
    assert value("jobq_fleet_queue_depth", queue="low") == 1
    assert value("jobq_fleet_tasks_running", queue="high") == 1
    assert value("jobq_fleet_tasks_running", queue="low") == 0
    assert 0 <= value("jobq_fleet_queue_oldest_pending_age_seconds", queue="high") < 60
    assert value("jobq_fleet_queue_paused", queue="high") == 0
    assert value("jobq_fleet_control_store_up", queue="high") == 1
    assert {state: value("jobq_fleet_workers", queue="high", state=state)
            for state in ("running", "paused", "draining", "stopping", "lost")} == {
        "running": 1, "paused": 0, "draining": 1, "stopping": 0, "lost": 1}
    assert value("jobq_fleet_workers", queue="low", state="paused") == 1
    assert value("jobq_fleet_workers", queue="low", state="running") == 0
    assert lease.task.cmd.startswith("sleep")


def test_a_queue_that_cannot_be_read_is_a_zero_not_a_503(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    SqliteBackend(str(db), "ok", "w-1", serve=True).close()
    missing = DataSource("gone", lambda: open_backend(
        Settings(sqlite_path=str(tmp_path / "none" / "q.db"), queue="gone"), for_ctl=True),
        lambda: None)
    app = create_app([_source(db, "ok"), missing])
    resp = app.test_client().get("/metrics")
    assert resp.status_code == 200
    got = _samples(resp.get_data(as_text=True))
    assert got[("jobq_fleet_queue_up", (("queue", "gone"),))] == 0
    assert got[("jobq_fleet_control_store_up", (("queue", "gone"),))] == 0
    assert ("jobq_fleet_queue_depth", (("queue", "gone"),)) not in got
    assert got[("jobq_fleet_queue_up", (("queue", "ok"),))] == 1
    assert got[("jobq_fleet_queue_depth", (("queue", "ok"),))] == 0
