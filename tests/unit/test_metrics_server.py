"""worker/metrics_server.py in-process: the registry served on loopback, the serve thread
started by core/threads.py (the worker's signals blocked) and gone after ``stop``, with the
port closed; port 0 is a real free port."""

from __future__ import annotations

import signal
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.worker.metrics import Metrics
from supervisor.worker.metrics_server import MetricsServer

pytestmark = pytest.mark.timeout(30)


def test_serves_the_registry_and_stop_closes_the_port() -> None:
    metrics = Metrics(None, backend="sqlite", queue="jobs", serve=True)
    assert metrics.enabled and metrics.write() is False  # no file: a sample only
    metrics.task_started()
    metrics.set_running(1)
    server = MetricsServer(metrics, "127.0.0.1", 0)
    assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}/metrics"
    server.start()
    try:
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            text = resp.read().decode()
        (thread,) = [t for t in threading.enumerate() if t.name == "metrics-http"]
    finally:
        server.stop()
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert got["jobq_tasks_started_total"] == 1 and got["jobq_tasks_running"] == 1
    assert not thread.is_alive()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=5)


def test_the_serve_thread_blocks_the_worker_signals() -> None:
    metrics = Metrics(None, backend="sqlite", queue="jobs", serve=True)
    server = MetricsServer(metrics, "127.0.0.1", 0)
    seen: list[set[int]] = []
    serve = server._serve

    def probe() -> None:  # what the serve thread's mask is, then its real work
        seen.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        serve()

    server._serve = probe  # type: ignore[method-assign]
    server.start()
    server.stop()
    assert seen and {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1} <= seen[0]
