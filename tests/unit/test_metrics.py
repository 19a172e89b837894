"""Metrics: the textfile parsed back with prometheus-client's own parser."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.worker.metrics import INSTALL_HINT, RENEWAL_BUCKETS, Metrics, MetricsUnavailable

pytestmark = pytest.mark.timeout(30)

LABELS = {"backend": "sqlite", "queue": "jobs"}


def read(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of every sample in the file."""
    samples = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name: str, **extra: str) -> float:
    return samples[(name, tuple(sorted({**LABELS, **extra}.items())))]


def types(path: Path) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(path.read_text())}


@pytest.fixture
def metrics(tmp_path: Path) -> Metrics:
    return Metrics(str(tmp_path / "jobq.prom"), backend="sqlite", queue="jobs")


def _record_a_run(m: Metrics) -> None:
    """Every recording call once or more: 3 starts, 1 success, 2 failures, 1 dead letter, 1
    requeue, 1 lock loss, renewals of 0.004 s and 0.2 s and a failed one of 40 s, backend
    errors 2 x receive and 1 x renew, 2 running, a successful receive."""
    for _ in range(3):
        m.task_started()
    m.task_succeeded()
    m.task_failed()
    m.task_failed()
    m.task_dead_lettered()
    m.task_requeued()
    m.lock_lost()
    m.renewal(0.004, ok=True)
    m.renewal(0.2, ok=True)
    m.renewal(40.0, ok=False)
    m.backend_error("receive")
    m.backend_error("receive")
    m.backend_error("renew")
    m.set_running(2)
    m.receive_ok()


def test_values_after_a_sequence_of_calls(metrics: Metrics, tmp_path: Path) -> None:
    path = tmp_path / "jobq.prom"
    before = time.time()
    _record_a_run(metrics)
    assert metrics.write() is True

    s = read(path)
    assert value(s, "jobq_tasks_started_total") == 3
    assert value(s, "jobq_tasks_succeeded_total") == 1
    assert value(s, "jobq_tasks_failed_total") == 2
    assert value(s, "jobq_tasks_dead_lettered_total") == 1
    assert value(s, "jobq_tasks_requeued_total") == 1
    assert value(s, "jobq_tasks_lock_lost_total") == 1
    assert value(s, "jobq_lease_renewals_total") == 2
    assert value(s, "jobq_lease_renewal_failures_total") == 1
    assert value(s, "jobq_backend_errors_total", operation="receive") == 2
    assert value(s, "jobq_backend_errors_total", operation="renew") == 1
    assert value(s, "jobq_tasks_running") == 2
    assert before <= value(s, "jobq_last_successful_receive_timestamp_seconds") <= time.time()
    assert value(s, "jobq_up") == 1

    me = psutil.Process()
    rss = value(s, "jobq_supervisor_resident_memory_bytes")
    assert 0.5 * me.memory_info().rss < rss < 2 * me.memory_info().rss
    cpu = value(s, "jobq_supervisor_cpu_seconds_total")
    times = me.cpu_times()
    assert 0 < cpu <= times.user + times.system

    h = "jobq_lease_renewal_duration_seconds"
    assert value(s, h + "_count") == 3
    assert value(s, h + "_sum") == pytest.approx(40.204)
    assert value(s, h + "_bucket", le="0.005") == 1
    assert value(s, h + "_bucket", le="0.25") == 2
    assert value(s, h + "_bucket", le="30.0") == 2
    assert value(s, h + "_bucket", le="+Inf") == 3
    assert RENEWAL_BUCKETS[0] == 0.005 and RENEWAL_BUCKETS[-1] == 30.0

    t = types(path)
    assert t["jobq_tasks_started"] == "counter"
    assert t["jobq_backend_errors"] == "counter"
    assert t["jobq_tasks_running"] == "gauge"
    assert t["jobq_supervisor_cpu_seconds_total"] == "gauge"
    assert t[h] == "histogram"


def test_rewrite_replaces_the_file_atomically(metrics: Metrics, tmp_path: Path) -> None:
    path = tmp_path / "jobq.prom"
    metrics.set_running(1)
    metrics.write()
    metrics.set_running(0)
    metrics.task_started()
    metrics.write()
    s = read(path)
    assert value(s, "jobq_tasks_running") == 0
    assert value(s, "jobq_tasks_started_total") == 1
    assert sorted(os.listdir(tmp_path)) == ["jobq.prom"]  # no temporary file left


def test_two_instances_do_not_share_a_registry(tmp_path: Path) -> None:
    a = Metrics(str(tmp_path / "a.prom"), backend="sqlite", queue="a")
    b = Metrics(str(tmp_path / "b.prom"), backend="servicebus", queue="b")
    a.task_started()
    a.write()
    b.write()
    sa, sb = read(tmp_path / "a.prom"), read(tmp_path / "b.prom")
    assert sa[("jobq_tasks_started_total", (("backend", "sqlite"), ("queue", "a")))] == 1
    assert sb[("jobq_tasks_started_total", (("backend", "servicebus"), ("queue", "b")))] == 0


@pytest.mark.parametrize("where", ["missing-dir", "is-a-dir"])
def test_unwritable_path_warns_once_and_never_raises(tmp_path: Path, caplog, where) -> None:
    if where == "missing-dir":
        path = tmp_path / "no" / "such" / "dir" / "jobq.prom"
    else:
        path = tmp_path / "a-directory"
        path.mkdir()
    m = Metrics(str(path), backend="sqlite", queue="jobs")
    with caplog.at_level(logging.DEBUG, logger="jobq.metrics"):
        for _ in range(5):
            m.task_started()
            assert m.write() is False
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert str(path) in warnings[0].getMessage()
    leftovers = [p for p in tmp_path.iterdir() if p.name != "a-directory"]
    assert leftovers == []  # the temporary file is cleaned up


def test_warning_repeats_after_a_minute(tmp_path: Path, caplog) -> None:
    m = Metrics(str(tmp_path / "missing" / "x.prom"), backend="sqlite", queue="jobs")
    now = [1000.0]
    m.clock = lambda: now[0]
    with caplog.at_level(logging.WARNING, logger="jobq.metrics"):
        m.write()
        now[0] += 59.0
        m.write()
        now[0] += 1.0
        m.write()
    assert len(caplog.records) == 2


def test_no_op_without_path_and_without_prometheus_client(tmp_path: Path,
                                                          monkeypatch) -> None:
    # None in sys.modules makes "import prometheus_client" raise ImportError.
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    m = Metrics(None, backend="sqlite", queue="jobs")
    assert not m.enabled
    _record_a_run(m)  # every call a no-op
    assert m.write() is False
    assert list(tmp_path.iterdir()) == []


def test_missing_prometheus_client_with_a_path_is_a_clear_error(tmp_path: Path,
                                                                monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MetricsUnavailable) as info:
        Metrics(str(tmp_path / "x.prom"), backend="sqlite", queue="jobs")
    assert isinstance(info.value, ValueError)
    assert str(info.value) == INSTALL_HINT == (
        "--metrics-file and --metrics-port need prometheus-client: pip install "
        "'jobq-supervisor[metrics]'")


def test_concurrent_calls_give_exact_counts(metrics: Metrics, tmp_path: Path) -> None:
    threads_n, per_thread = 8, 2000
    go = threading.Barrier(threads_n)

    def hammer() -> None:
        go.wait()
        for i in range(per_thread):
            metrics.task_started()
            metrics.task_failed()
            metrics.renewal(0.01, ok=i % 2 == 0)
            metrics.backend_error("renew")

    workers = [threading.Thread(target=hammer) for _ in range(threads_n)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(20)
    assert not any(t.is_alive() for t in workers)
    metrics.write()
    s = read(tmp_path / "jobq.prom")
    total = threads_n * per_thread
    assert value(s, "jobq_tasks_started_total") == total
    assert value(s, "jobq_tasks_failed_total") == total
    assert value(s, "jobq_lease_renewals_total") == total / 2
    assert value(s, "jobq_lease_renewal_failures_total") == total / 2
    assert value(s, "jobq_lease_renewal_duration_seconds_count") == total
    assert value(s, "jobq_backend_errors_total", operation="renew") == total
