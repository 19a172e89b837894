"""The queue sampler thread: queue depth and the age of the oldest pending task as gauges of
the metrics file, for autoscaling rules (KEDA, a VM scale set; docs/fleet.rst, "Autoscaling").

Both are backend calls, and a network call must never delay the data plane: they run on a
thread of their own with a backend of their own, opened on that thread (``open_backend``
with ``for_ctl=True, create=False``: no receivers, nothing created).  Only with
``--metrics-file`` or ``--metrics-port``; one sample every ``--metrics-interval``, on Azure
every 15 s at the least (each sample is billed: 2 calls on Storage Queue, 1 on Service Bus).
The sampler only sets gauges (prometheus-client values are thread-safe); the main thread
writes the file.

A failing backend only delays this thread: it backs off (doubling, up to BACKOFF_MAX), logs
at most once a minute and once when a sample works again (core/backoff.py), and the gauges
keep their last value, so a scaler does not scale in on a blip;
``jobq_queue_sampled_timestamp_seconds`` says how old they are.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Union

from ..backends import AZURE, open_backend
from ..backends.base import Backend, BackendConfigError, BackendError
from ..backends.multi import MultiQueueBackend
from ..core.backoff import Outage
from ..core.threads import start_thread

if TYPE_CHECKING:
    from ..core.settings import Settings
    from .metrics import Metrics

log = logging.getLogger("jobq.metrics")

AZURE_MIN_INTERVAL = 15.0  # bounds the cost: 240 samples an hour per worker
BACKOFF_MAX = 300.0
LOG_EVERY = 60.0
STOP_WAIT = 1.0  # a call in flight at exit is not waited for longer (daemon thread)


class QueueSampler:
    """The sampler thread.  ``start``/``stop`` are called from the main thread; everything
    else runs on the sampler thread."""

    def __init__(self, opener: Callable[[], Backend], metrics: Metrics, interval: float,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.opener, self.metrics, self.interval = opener, metrics, interval
        self.clock, self.wall = clock, wall  # monotonic for the schedule, wall for the ages
        self.backend: Union[Backend, None] = None
        self.outage = Outage("queue (metrics sampler)", log, clock, backoff_min=2 * interval,
                             backoff_max=BACKOFF_MAX, log_every=LOG_EVERY, repeat=True,
                             effect="the queue gauges keep their last value")
        self._stop = threading.Event()
        self._thread: Union[threading.Thread, None] = None

    @classmethod
    def for_worker(cls, settings: Settings, metrics: Metrics) -> Union[QueueSampler, None]:
        """The worker's sampler, or None without ``--metrics-file`` or ``--metrics-port``
        (main thread)."""
        if not metrics.enabled:
            return None
        interval = settings.metrics_interval
        if settings.backend in AZURE:
            interval = max(interval, AZURE_MIN_INTERVAL)
        return cls(lambda: open_backend(settings, for_ctl=True, create=False), metrics,
                   interval)

    def start(self) -> None:
        """Start the thread (main thread)."""
        self._thread = start_thread(self._run, "queue-sampler")

    def stop(self) -> None:
        """Stop the thread; a backend call in flight is not waited for long (main thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT)

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            delay = self.sample()
        if self.backend is not None:
            try:
                self.backend.close()
            except BackendError as exc:
                log.debug("closing the sampler's backend: %s", exc)

    def sample(self) -> float:
        """One sample, opening the backend first if needed; seconds until the next one."""
        try:
            if self.backend is None:
                self.backend = self.opener()
            # A worker's several queues: each its own series (label queue=NAME), all
            # sampled before any is set, so that the gauges stay of one moment.
            parts: list[tuple[str | None, Backend]] = (
                list(self.backend.backends.items())
                if isinstance(self.backend, MultiQueueBackend) else [(None, self.backend)])
            samples = []
            for name, backend in parts:
                can_age = backend.tells_age
                samples.append((name, backend.size(), can_age,
                                backend.oldest_pending_age(self.wall()) if can_age else None))
        except (BackendError, BackendConfigError) as exc:
            return self._failed(str(exc))
        except Exception as exc:  # an SDK surprise must not end the sampler
            return self._failed(f"{type(exc).__name__}: {exc}")
        for name, depth, can_age, age in samples:
            self.metrics.queue_sampled(depth, age, can_age, self.wall(), queue=name)
        self.outage.succeeded()
        return self.interval

    @property
    def failures(self) -> int:
        """Failed samples in a row."""
        return self.outage.failures

    def _failed(self, why: str) -> float:
        return self.outage.failed("sample", why)
