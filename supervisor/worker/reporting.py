"""What the worker tells the outside: systemd status and watchdog pings, the metrics file and
its HTTP server, and the one-line summary at exit.

Main thread only.  The main loop calls ``report`` once a turn; each output has its own period.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from ..core.settings import Settings
from .keeper import LeaseKeeper
from .metrics import Metrics
from .metrics_server import MetricsServer
from .notify import Notifier
from .sampler import QueueSampler
from .watchdog import RunningTask

log = logging.getLogger("jobq.worker")

STATUS_EVERY = 1.0


class Reporter:
    """systemd status/watchdog and the metrics file (main thread only).

    ``counts`` is the worker's outcome counter dict (``Settlement.counts``), read, never
    written."""

    def __init__(self, settings: Settings, notifier: Notifier, metrics: Metrics,
                 counts: dict[str, int], clock: Callable[[], float] = time.monotonic) -> None:
        self.s = settings
        self.notifier = notifier
        self.metrics = metrics
        self.counts = counts
        self.next_metrics = clock()
        wd = notifier.watchdog_interval()
        self.watchdog_ping = wd / 2 if wd else None
        self.next_ping = clock()
        self.last_status = ""
        self.next_status = clock()
        self.stalled_logged = False
        metrics.set_slots_total(settings.num_workers)
        self.sampler = QueueSampler.for_worker(settings, metrics)
        # bound now: a port in use ends the start (MetricsUnavailable), before any task runs
        self.server = MetricsServer.for_worker(settings, metrics)

    def start(self) -> None:
        """Start the queue sampler thread, with ``--metrics-file`` or ``--metrics-port``, and
        the metrics' HTTP server with ``--metrics-port`` (main thread)."""
        if self.sampler is not None:
            self.sampler.start()
        if self.server is not None:
            self.server.start()

    def stop(self) -> None:
        """Stop the queue sampler and HTTP server threads (main thread)."""
        if self.sampler is not None:
            self.sampler.stop()
        if self.server is not None:
            self.server.stop()

    def next_due(self) -> float:
        """When ``report`` has something to do next, inf if never (main thread)."""
        t = float("inf")
        if self.watchdog_ping is not None:
            t = min(t, self.next_ping)
        if self.metrics.enabled:
            t = min(t, self.next_metrics)
        return t

    def report(self, now: float, state: str, active: list[RunningTask],
               settling: list[LeaseKeeper]) -> None:
        """Ping, status and metrics as far as each is due (main thread).

        ``state`` names the worker's state; ``active`` are its tasks not yet settled,
        ``settling`` the keepers whose settlement is running."""
        if self.watchdog_ping is not None and now >= self.next_ping:
            keepers = [rt.keeper for rt in active] + settling
            stalled = [k.task_id for k in keepers if not k.healthy(now)]
            if stalled:
                if not self.stalled_logged:
                    log.error("lease thread(s) stalled for %s: withholding the systemd "
                              "watchdog ping", ", ".join(stalled))
                    self.stalled_logged = True
            else:
                self.stalled_logged = False
                self.notifier.watchdog()
            self.next_ping = now + self.watchdog_ping
        if self.notifier.enabled and now >= self.next_status:
            c = self.counts
            text = (f"{state}: running={len(active)} "
                    f"succeeded={c['succeeded']} failed={c['failed']} "
                    f"requeued={c['requeued']} lock_lost={c['lock_lost']}")
            if text != self.last_status:
                self.notifier.status(text)
                self.last_status = text
            self.next_status = now + STATUS_EVERY
        if self.metrics.enabled and now >= self.next_metrics:
            self.metrics.set_running(len(active), len(active) + len(settling))
            self.metrics.write()
            self.next_metrics = now + self.s.metrics_interval

    def summary(self, duration: float, stop_reason: str, exit_code: int) -> None:
        """The one line logged at exit, the last one of the run (main thread)."""
        log_summary(self.counts, duration, stop_reason, exit_code)


ZERO_COUNTS = {"succeeded": 0, "failed": 0, "retried": 0, "requeued": 0, "lock_lost": 0,
               "dead_lettered": 0, "cancelled": 0}


def log_summary(c: dict[str, int], duration: float, stop_reason: str, exit_code: int) -> None:
    """The summary line; also for a run stopped before its worker existed (main thread)."""
    # The same fields as keys: --log-format json readers need not parse the message.
    fields: dict[str, object] = {
        k: c[k] for k in ("succeeded", "failed", "dead_lettered", "retried", "requeued",
                          "lock_lost", "cancelled")}
    fields.update(duration_s=round(duration, 1), stop=stop_reason or "done",
                  exit_status=exit_code)
    log.info("summary: succeeded=%d failed=%d dead_lettered=%d retried=%d requeued=%d "
             "lock_lost=%d cancelled=%d duration=%.1fs stop=%r exit=%d", c["succeeded"],
             c["failed"], c["dead_lettered"], c["retried"], c["requeued"], c["lock_lost"],
             c["cancelled"],
             duration, stop_reason or "done", exit_code, extra=fields)
