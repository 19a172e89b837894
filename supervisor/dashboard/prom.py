"""The dashboard's ``/metrics``: fleet-wide gauges of every served queue in the Prometheus
text format, for one scrape target per fleet instead of one per worker (each worker's own
metrics are its ``--metrics-port``, worker/metrics_server.py).

Read per scrape on the request thread from the same DataSource reads as the pages
(ops/fleet.py's status and workers listing); nothing is cached.  The names carry
``jobq_fleet_`` so that they never sum with the workers' own ``jobq_queue_depth`` series.
A queue (or control store) that cannot be read is a 0 in ``jobq_fleet_queue_up``
(``jobq_fleet_control_store_up``) and none of its other series, never a 503: the other
queues' values still arrive.  prometheus-client formats the text (the ``dashboard`` extra
installs it); without it the endpoint is a 501 saying so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from flask import Flask, Response, request

from ..fleet.control.records import WORKER_STATES
from .data import DataSource, Unavailable

if TYPE_CHECKING:
    from prometheus_client.core import GaugeMetricFamily

    from .queues import Queues

STATES = (*WORKER_STATES, "lost")  # every state a worker is shown in (0 when none is)
INSTALL_HINT = "/metrics needs prometheus-client: pip install 'jobq-supervisor[dashboard]'\n"


def register(app: Flask, queues: Queues) -> None:
    """Add ``/metrics`` to ``app`` (main thread, while the app is built)."""

    @app.get("/metrics")
    def metrics() -> Response:
        try:
            from prometheus_client import CollectorRegistry
            from prometheus_client.exposition import choose_encoder
        except ImportError:
            return Response(INSTALL_HINT, 501, mimetype="text/plain")
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FleetCollector([queues.sources[n] for n in queues.names]))
        # the format the scraper asks for (text, or OpenMetrics), as the workers' server does
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return Response(encoder(registry), 200, content_type=content_type)


class FleetCollector:
    """One scrape's gauges, read when prometheus-client collects them (a request thread)."""

    def __init__(self, sources: list[DataSource]) -> None:
        self.sources = sources

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("queue",)
                  ) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels))

        up = gauge("jobq_fleet_queue_up", "1 when the queue could be read for this scrape.")
        depth = gauge("jobq_fleet_queue_depth", "Tasks in the queue, as the workers' "
                      "jobq_queue_depth counts them (SQLite, PostgreSQL: pending).")
        oldest = gauge("jobq_fleet_queue_oldest_pending_age_seconds", "Age of the oldest "
                       "task waiting for a worker (0 when none waits; absent on Service Bus).")
        running = gauge("jobq_fleet_tasks_running", "Tasks running on the queue's workers.")
        paused = gauge("jobq_fleet_queue_paused", "1 while the queue is paused (jobq-ctl "
                       "pause); absent when the control store cannot tell.")
        store_up = gauge("jobq_fleet_control_store_up", "1 when the queue's workers could be "
                         "read from the control store for this scrape.")
        workers = gauge("jobq_fleet_workers", "The queue's workers by state (lost: no "
                        "heartbeat for 3 intervals; a worker of several queues counts in "
                        "each).", ("queue", "state"))
        for d in self.sources:
            q = [d.queue]
            try:
                status = d.status()
                with d.using("queue"):
                    size = d.backend().size()
            except Unavailable:
                up.add_metric(q, 0)
            else:
                up.add_metric(q, 1)
                depth.add_metric(q, size)
                running.add_metric(q, len(status["running"]))
                _maybe(oldest, q, status["oldest_pending_age_s"])
                _maybe(paused, q, status["paused"])
            try:
                states, _ = d.fleet_states()
            except Unavailable:
                store_up.add_metric(q, 0)
                continue
            store_up.add_metric(q, 1)
            seen = list(states.values())
            for state in [*STATES, *sorted(set(seen) - set(STATES))]:
                workers.add_metric([d.queue, state], seen.count(state))
        yield from (up, depth, oldest, running, paused, store_up, workers)


def _maybe(family: GaugeMetricFamily, labels: list[str], value: float | bool | None) -> None:
    if value is not None:
        family.add_metric(labels, float(value))

