"""The queue sampler (sampler.py): gauges set from its own backend on its own thread, a
failing backend backed off and logged at most once a minute, gauges kept; injected clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.core.settings import Settings
from supervisor.worker.metrics import Metrics
from supervisor.worker.sampler import AZURE_MIN_INTERVAL, BACKOFF_MAX, LOG_EVERY, QueueSampler
from tests.conftest import wait_for
from tests.fakes.backend import FakeBackend

pytestmark = pytest.mark.timeout(30)


class AgedQueue(FakeBackend):
    """A queue of 7 tasks whose backend can tell the oldest one's age (Storage Queue)."""

    name = "storage-queue"
    tells_age = True

    def __init__(self) -> None:
        super().__init__(depth=7, age=42.0)


class NoAge(AgedQueue):
    name = "servicebus"
    tells_age = False


def read(path: Path) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(path.read_text())
            for s in f.samples}


@pytest.fixture
def metrics(tmp_path: Path) -> Metrics:
    return Metrics(str(tmp_path / "m.prom"), backend="storage-queue", queue="q")


def make(metrics: Metrics, backend: AgedQueue, now: list[float]) -> QueueSampler:
    return QueueSampler(lambda: backend, metrics, 5.0,  # type: ignore[arg-type,return-value]
                        clock=lambda: now[0], wall=lambda: 1000.0)


def test_no_queue_gauge_before_the_first_sample(metrics: Metrics, tmp_path: Path) -> None:
    metrics.write()
    g = read(tmp_path / "m.prom")
    assert "jobq_queue_depth" not in g and "jobq_queue_oldest_pending_age_seconds" not in g


def test_a_sample_sets_the_gauges(metrics: Metrics, tmp_path: Path) -> None:
    backend = AgedQueue()
    assert make(metrics, backend, [0.0]).sample() == 5.0
    metrics.write()
    g = read(tmp_path / "m.prom")
    assert g["jobq_queue_depth"] == 7
    assert g["jobq_queue_oldest_pending_age_seconds"] == 42.0
    assert g["jobq_queue_sampled_timestamp_seconds"] == 1000.0
    backend.age = None  # nothing waits: 0, not absent
    make(metrics, backend, [0.0]).sample()
    metrics.write()
    assert read(tmp_path / "m.prom")["jobq_queue_oldest_pending_age_seconds"] == 0


def test_a_backend_that_cannot_tell_the_age_has_no_age_series(metrics: Metrics,
                                                              tmp_path: Path) -> None:
    make(metrics, NoAge(), [0.0]).sample()
    metrics.write()
    g = read(tmp_path / "m.prom")
    assert g["jobq_queue_depth"] == 7 and "jobq_queue_oldest_pending_age_seconds" not in g


def test_failures_back_off_log_once_a_minute_and_keep_the_gauges(
        metrics: Metrics, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "jobq.metrics")
    backend, now = AgedQueue(), [0.0]
    sampler = make(metrics, backend, now)
    sampler.sample()
    backend.fail, backend.depth = True, 99
    delays = []
    for _ in range(12):
        delays.append(sampler.sample())
        now[0] += delays[-1]
    assert delays[:3] == [10.0, 20.0, 40.0] and delays[-1] == BACKOFF_MAX
    warnings = [r for r in caplog.records
                if "queue (metrics sampler) unavailable" in r.getMessage()]
    assert 1 < len(warnings) <= sum(delays) / LOG_EVERY + 1
    metrics.write()
    assert read(tmp_path / "m.prom")["jobq_queue_depth"] == 7  # the last good value
    backend.fail = False
    assert sampler.sample() == 5.0
    assert [r.getMessage() for r in caplog.records if "again" in r.getMessage()] == [
        "queue (metrics sampler) reachable again after 12 failed call(s)"]
    metrics.write()
    assert read(tmp_path / "m.prom")["jobq_queue_depth"] == 99


def test_runs_on_its_own_thread_and_closes_its_backend(metrics: Metrics,
                                                        tmp_path: Path) -> None:
    backend = AgedQueue()
    sampler = QueueSampler(lambda: backend, metrics, 0.01)  # type: ignore[arg-type,return-value]
    sampler.start()
    try:
        wait_for(lambda: len(backend.threads) >= 3, 10, what="three samples")
    finally:
        sampler.stop()
    assert len(backend.threads) >= 3 and set(backend.threads) == {"queue-sampler"}
    assert backend.closed


def test_for_worker_only_with_a_metrics_file_and_at_most_every_15s_on_azure(
        metrics: Metrics) -> None:
    assert QueueSampler.for_worker(Settings(), Metrics(None, backend="x", queue="q")) is None
    sqlite = QueueSampler.for_worker(Settings(metrics_interval=1.0), metrics)
    assert sqlite is not None and sqlite.interval == 1.0
    azure = QueueSampler.for_worker(
        Settings(backend="storage-queue", metrics_interval=1.0, connection_string="x"),
        metrics)
    assert azure is not None and azure.interval == AZURE_MIN_INTERVAL


def test_several_queues_have_a_series_each(tmp_path: Path) -> None:
    from supervisor.backends.multi import MultiQueueBackend

    metrics = Metrics(str(tmp_path / "m.prom"), backend="storage-queue", queue="high,low")
    high, low = AgedQueue(), NoAge()
    high.depth, low.depth = 3, 11
    for b in (high, low):  # what MultiQueueBackend reads of each, besides the sampler's
        b.lost_lease_return_delay, b.receive_ahead = 0.0, False  # type: ignore[attr-defined]
        b.change_probe = b.quick_settle = False  # type: ignore[attr-defined]
        b.no_retry_delay = None  # type: ignore[attr-defined]
    multi = MultiQueueBackend({"high": high, "low": low})  # type: ignore[dict-item]
    make(metrics, multi, [0.0]).sample()  # type: ignore[arg-type]
    metrics.write()
    series = {(s.name, s.labels["queue"]): s.value
              for f in text_string_to_metric_families((tmp_path / "m.prom").read_text())
              for s in f.samples if s.name.startswith("jobq_queue_")}
    assert series[("jobq_queue_depth", "high")] == 3
    assert series[("jobq_queue_depth", "low")] == 11
    assert series[("jobq_queue_oldest_pending_age_seconds", "high")] == 42.0
    assert ("jobq_queue_oldest_pending_age_seconds", "low") not in series
    assert ("jobq_queue_depth", "high,low") not in series
