"""Prometheus metrics, written as a textfile for node_exporter's textfile collector and/or
served over HTTP (``--metrics-port``: worker/metrics_server.py serves this registry).

prometheus-client is an optional extra (``jobq-supervisor[metrics]``): without
``--metrics-file`` and ``--metrics-port`` every method is a cheap no-op and the library is
never imported.  The registry is private, so nothing of the client's default
process/platform collectors (or another library's metrics) leaks into our file.
``write_to_textfile`` does the formatting and the atomic rename; we never hand-format the
exposition text.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from functools import partialmethod
from types import ModuleType
from typing import TYPE_CHECKING, Callable

import psutil

if TYPE_CHECKING:  # names only: the library is imported only for a metrics file
    from prometheus_client.core import CounterMetricFamily

log = logging.getLogger("jobq.metrics")

INSTALL_HINT = ("--metrics-file and --metrics-port need prometheus-client: pip install "
                "'jobq-supervisor[metrics]'")
WARN_EVERY = 60.0  # a broken metrics file is worth one line a minute, not one per write
RENEWAL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class MetricsUnavailable(ValueError):
    """Metrics were asked for but cannot be had: prometheus-client is not installed, or
    ``--metrics-port`` cannot listen (the one-line message says which; exit status 2)."""


class Metrics:
    """The worker's counters and gauges.

    Every recording method is thread-safe (prometheus-client guards each value with a lock) and
    may be called from any thread: the main loop, lease keepers, the poller.  ``write`` is
    called by the main thread.
    """

    def __init__(self, path: str | None, *, backend: str, queue: str,
                 serve: bool = False) -> None:
        self.path = path
        # on with a file, or with ``serve``: the registry is served over HTTP (--metrics-port)
        self._on = path is not None or serve
        self._warned_at: float | None = None
        self.clock: Callable[[], float] = time.monotonic  # paces the warnings; tests swap it
        self._process: psutil.Process | None = None
        if not self._on:
            return
        try:
            import prometheus_client
        except ImportError as exc:
            raise MetricsUnavailable(INSTALL_HINT) from exc
        self._pc: ModuleType = prometheus_client
        self.registry = prometheus_client.CollectorRegistry()
        labels = {"backend": backend, "queue": queue}
        names = list(labels)

        # prometheus-client has no const labels: every metric gets the same two label names
        # and we keep the one child per metric that carries our values.
        def counter(name: str, doc: str) -> prometheus_client.Counter:
            return prometheus_client.Counter(name, doc, names,
                                             registry=self.registry).labels(**labels)

        def gauge(name: str, doc: str) -> prometheus_client.Gauge:
            return prometheus_client.Gauge(name, doc, names,
                                           registry=self.registry).labels(**labels)

        # The task events, by the name their method passes to ``_inc``.
        self._events = {key: counter(f"jobq_tasks_{key}_total", doc) for key, doc in (
            ("started", "Tasks spawned."),
            ("succeeded", "Tasks that exited 0."),
            ("failed", "Failed task attempts (retried or not)."),
            ("dead_lettered", "Messages dead-lettered (attempts exhausted, poison)."),
            ("requeued", "Tasks put back on the queue by a stop or preemption."),
            ("lock_lost", "Tasks whose lease was lost while they ran."),
            ("cancelled", "Tasks cancelled by an operator (jobq-ctl cancel)."))}
        self._renewals = counter("jobq_lease_renewals_total", "Successful lease renewals.")
        self._renewal_failures = counter("jobq_lease_renewal_failures_total",
                                         "Failed lease renewal calls.")
        self._backend_errors = prometheus_client.Counter(
            "jobq_backend_errors_total", "Backend calls that failed, by operation.",
            [*names, "operation"], registry=self.registry)
        self._labels = labels
        self._running = gauge("jobq_tasks_running", "Tasks running now.")
        # Autoscaling signals (docs/fleet-internals.rst, "The fleet layer"): this worker's load
        # from the main thread, the queue's from the sampler thread (worker/sampler.py).
        self._slots_busy = gauge("jobq_slots_busy", "Slots running a task now.")
        self._slots_total = gauge("jobq_slots_total", "Slots of this worker (-n).")
        self._in_flight = gauge("jobq_tasks_in_flight", "Tasks whose lease this worker holds "
                                "(running, or exited and being settled).")
        # The queue's gauges have no child until the first sample: before it (and on Service
        # Bus for the age, which it cannot tell) the series is absent, not a misleading 0.
        def family(name: str, doc: str) -> prometheus_client.Gauge:
            return prometheus_client.Gauge(name, doc, names, registry=self.registry)

        self._depth = family("jobq_queue_depth", "Tasks in the queue (SQLite: pending; "
                             "Azure: the service's count, with messages held by workers).")
        self._sampled_at = family("jobq_queue_sampled_timestamp_seconds",
                                  "Wall-clock time of the last successful queue sample.")
        self._oldest = family(
            "jobq_queue_oldest_pending_age_seconds", "Age of the oldest task waiting for a "
            "worker (0 when none waits).")
        self._last_receive = gauge("jobq_last_successful_receive_timestamp_seconds",
                                   "Wall-clock time of the last receive call that succeeded.")
        self._rss = gauge("jobq_supervisor_resident_memory_bytes",
                          "Resident memory of the supervisor process (not its tasks).")
        self._cpu = gauge("jobq_supervisor_cpu_seconds_total",
                          "User+system CPU seconds of the supervisor process (not its tasks).")
        self._up = gauge("jobq_up", "1 while the supervisor runs.")
        self._renewal_duration = prometheus_client.Histogram(
            "jobq_lease_renewal_duration_seconds", "Duration of lease renewal calls.",
            names, buckets=RENEWAL_BUCKETS, registry=self.registry).labels(**labels)
        self._up.set(1)
        self._process = psutil.Process()
        self.registry.register(OutputDropped(labels))

    @property
    def enabled(self) -> bool:
        return self._on

    # -- any thread ----------------------------------------------------------------------
    def _inc(self, event: str) -> None:
        if self._on:
            self._events[event].inc()

    # One event each (main thread or a keeper thread); a no-op without --metrics-file.
    task_started = partialmethod(_inc, "started")
    task_succeeded = partialmethod(_inc, "succeeded")
    task_failed = partialmethod(_inc, "failed")
    task_dead_lettered = partialmethod(_inc, "dead_lettered")
    task_requeued = partialmethod(_inc, "requeued")
    task_cancelled = partialmethod(_inc, "cancelled")
    lock_lost = partialmethod(_inc, "lock_lost")

    def renewal(self, duration: float, ok: bool) -> None:
        """One renewal call that took ``duration`` seconds (lease keeper threads)."""
        if not self._on:
            return
        self._renewal_duration.observe(max(0.0, duration))
        if ok:
            self._renewals.inc()
        else:
            self._renewal_failures.inc()

    def backend_error(self, operation: str) -> None:
        if self._on:
            self._backend_errors.labels(operation=operation, **self._labels).inc()

    def set_running(self, n: int, in_flight: int | None = None) -> None:
        """``n`` tasks run (and fill as many slots); ``in_flight`` leases held (default n)."""
        if self._on:
            self._running.set(n)
            self._slots_busy.set(n)
            self._in_flight.set(n if in_flight is None else in_flight)

    def set_slots_total(self, n: int) -> None:
        if self._on:
            self._slots_total.set(n)

    def queue_sampled(self, depth: int, oldest_age: float | None, can_age: bool,
                      wall: float, queue: str | None = None) -> None:
        """One successful queue sample (sampler thread).  ``can_age``: the backend can tell
        the oldest pending age, and ``oldest_age`` None then means nothing waits.  ``queue``:
        one of a worker's several queues (its series' label), None for the worker's one."""
        if not self._on:
            return
        labels = self._labels if queue is None else {**self._labels, "queue": queue}
        self._depth.labels(**labels).set(depth)
        if can_age:
            self._oldest.labels(**labels).set(oldest_age or 0.0)
        self._sampled_at.labels(**labels).set(wall)

    def receive_ok(self) -> None:
        if self._on:
            self._last_receive.set(time.time())

    # -- main thread ---------------------------------------------------------------------
    def write(self) -> bool:
        """Sample this process's RSS/CPU and write the file atomically (main thread); without
        a file, only the sample (for the HTTP scrapes).

        Returns whether the file was written.  Never raises: a full disk or a bad path must
        not take the worker down, and is logged at WARNING at most once a minute.
        """
        if not self._on:
            return False
        assert self._process is not None
        try:
            with self._process.oneshot():
                cpu = self._process.cpu_times()
                self._rss.set(self._process.memory_info().rss)
                self._cpu.set(cpu.user + cpu.system)
        except psutil.Error as exc:  # cannot happen for ourselves, but never worth a crash
            log.debug("cannot sample the supervisor's own CPU/RSS: %s", exc)
        if self.path is None:
            return False
        try:
            self._pc.write_to_textfile(self.path, self.registry)
            # For node_exporter, another user: counts and names only, readable as before the
            # umask 077 (core/file_modes.py) made everything else private.
            os.chmod(self.path, 0o644)
        except OSError as exc:
            now = self.clock()
            if self._warned_at is None or now - self._warned_at >= WARN_EVERY:
                self._warned_at = now
                log.warning("cannot write metrics file %s (next warning in %.0fs at the "
                            "earliest): %s", self.path, WARN_EVERY, exc)
            return False
        return True


class OutputDropped:
    """``jobq_task_output_lines_dropped_total``: task output lines the log writer was too far
    behind to take (``logs.OutputSink``).  Read from the pump's count when the file is
    written (main thread), so the pump pays no lock per dropped line."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels

    def collect(self) -> Iterator[CounterMetricFamily]:
        from prometheus_client.core import CounterMetricFamily

        from .logs import dropped_lines

        family = CounterMetricFamily(
            "jobq_task_output_lines_dropped", "Task output lines not logged: the log writer "
            "was behind (a marker line gives each count).", labels=list(self.labels))
        family.add_metric(list(self.labels.values()), dropped_lines())
        yield family
