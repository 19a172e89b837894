"""The dashboard's depth sampler: one thread that reads each served queue's counts in turn
every ~15 s and keeps the last hour per queue, for the overview's charts (queue depth; tasks
finished per minute from the growth of the succeeded/failed counts -- the backend's where it
counts them (SQLite), else the sum of the workers' own counters in their records (Azure)).
It stops on an Event and uses clients of its own (DataSource is per thread).

The history survives a restart: when a minute is over, the sampler writes that minute of
each queue (its last depth counts, the tasks finished in it) into the queue's control store
(``put_history``; kept 7 days), and a new dashboard reads the last WINDOW back (``restore``).
A store that is down costs one log line per outage, never a sample."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core.threads import start_thread
from ..fleet.control.records import HistoryPoint
from .data import DataSource, Refused, Unavailable

log = logging.getLogger("jobq.dashboard")
WINDOW = 3600.0  # s of history kept and drawn
# The counts the depth chart draws, in the backend's own words: SQLite and Service Bus say
# ``pending`` (SQLite ``running`` too); Storage Queue says ``queued``, its one count of
# waiting, running and backing-off messages together, and cannot count running apart.
DEPTH_STATES = ("pending", "queued", "running")


@dataclass(frozen=True)
class Sample:
    when: float  # wall clock, epoch seconds
    depth: dict[str, int]  # the DEPTH_STATES the backend reports, by its word
    succeeded: int | None  # None: unknown (no backend count, no control store)
    failed: int | None


class History:
    """Samples of the last WINDOW seconds.  Written by the sampler thread, read by request
    threads (under a lock)."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._samples: collections.deque[Sample] = collections.deque()
        # finished per minute as read back from the store (restore), by minute
        self._kept: dict[float, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def add(self, sample: Sample) -> None:
        with self._lock:
            self._samples.append(sample)
            while self._samples and self._samples[0].when < sample.when - self.window:
                self._samples.popleft()
            for minute in [m for m in self._kept if m < sample.when - self.window]:
                del self._kept[minute]

    def load(self, points: Sequence[HistoryPoint]) -> None:
        """The minutes a store kept, oldest first, before any live sample (the main thread,
        at start): a sample of each minute's depth, and its finished tasks where known."""
        for p in points:
            # counts None: the first live sample after them adds no growth of its own
            self.add(Sample(when=p.minute, depth=dict(p.depth), succeeded=None, failed=None))
            if p.succeeded is not None and p.failed is not None:
                with self._lock:
                    self._kept[p.minute] = (p.succeeded, p.failed)

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def finished_per_minute(self) -> list[tuple[float, int, int]]:
        """(minute start, succeeded, failed) per minute from the count deltas; a count that
        shrank (a purge, a requeue) adds nothing."""
        buckets: dict[float, list[int]] = {}
        samples = self.samples()
        for prev, cur in zip(samples, samples[1:]):
            if None in (prev.succeeded, cur.succeeded, prev.failed, cur.failed):
                continue
            minute = cur.when - cur.when % 60
            b = buckets.setdefault(minute, [0, 0])
            b[0] += max(0, cur.succeeded - prev.succeeded)  # type: ignore[operator]
            b[1] += max(0, cur.failed - prev.failed)  # type: ignore[operator]
        with self._lock:
            kept = dict(self._kept)
        # a kept minute ended before this dashboard's first sample; were one also sampled
        # live (another dashboard's clock ahead), the live count wins
        for minute, (ok, bad) in kept.items():
            buckets.setdefault(minute, [ok, bad])
        return [(m, s, f) for m, (s, f) in sorted(buckets.items())]

    def point(self, queue: str, minute: float) -> HistoryPoint | None:
        """The point to keep of ``minute`` (its start, epoch s): its last sample's depth
        and the tasks finished in it (None: unknown); None when no sample fell in it."""
        last = next((s for s in reversed(self.samples())
                     if minute <= s.when < minute + 60), None)
        if last is None:
            return None
        done = next(((ok, bad) for m, ok, bad in self.finished_per_minute() if m == minute),
                    (None, None))
        return HistoryPoint(queue=queue, minute=minute, depth=dict(last.depth),
                            succeeded=done[0], failed=done[1])


def restore(data: DataSource, history: History, now: float) -> None:
    """Fill ``history`` with the last window the control store kept of ``data``'s queue
    (the main thread, before serving); a store that cannot be read: one log line, and the
    charts start empty as before."""
    try:
        points = data.history(now - history.window)
    except (Unavailable, Refused) as exc:
        log.warning("dashboard history: %s: not read back: %s", data.queue, exc)
        return
    finally:
        data.close_thread()  # the main thread's clients: the request threads open their own
    history.load(points)


@dataclass
class _Queue:
    """One queue's sampling state (the sampler thread only)."""

    data: DataSource
    history: History
    failing: bool = False
    minute: float | None = None  # the minute being sampled, kept when the next one starts
    keep_failing: bool = False  # the last point could not be kept (logged once)
    # Workers' finished counters: the last seen per worker id, and the growth summed
    # since the dashboard started (a restarted worker's counters start again at 0).
    last: dict[str, tuple[int, int]] = field(default_factory=dict)
    grown: list[int] = field(default_factory=lambda: [0, 0])


def summed_per_minute(histories: Sequence[History]) -> list[tuple[float, int, int]]:
    """finished_per_minute over several queues, summed per minute (a request thread)."""
    buckets: dict[float, list[int]] = {}
    for h in histories:
        for minute, ok, bad in h.finished_per_minute():
            b = buckets.setdefault(minute, [0, 0])
            b[0] += ok
            b[1] += bad
    return [(m, s, f) for m, (s, f) in sorted(buckets.items())]


class Sampler:
    """The thread that fills a History per queue every ``interval`` seconds until ``stop``
    is set.  ``data``: one DataSource (with ``history``) or a list of (DataSource, History),
    sampled in turn."""

    def __init__(self, data: DataSource | Sequence[tuple[DataSource, History]],
                 history: History | None = None, interval: float = 15.0,
                 clock: Callable[[], float] = time.time) -> None:
        pairs = list(data) if isinstance(data, Sequence) else [(data, history or History())]
        self._queues = [_Queue(d, h) for d, h in pairs]
        self.interval = interval
        self.clock = clock
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_thread(self._run, "dashboard-sampler")

    def close(self, timeout: float = 5.0) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def sample_once(self) -> None:
        """One sample of every queue (the sampler thread; tests call it directly)."""
        for q in self._queues:
            if self.stop.is_set():
                return
            self._sample(q)

    def _sample(self, q: _Queue) -> None:
        try:
            counts = q.data.counts()
        except Unavailable as exc:
            if not q.failing:  # one line per outage, not one per sample
                log.warning("dashboard sampler: %s: %s", q.data.queue, exc)
            q.failing = True
            return
        q.failing = False
        succeeded, failed = counts.get("succeeded"), counts.get("failed")
        if succeeded is None or failed is None:
            succeeded, failed = self._workers_finished(q)
        when = self.clock()
        q.history.add(Sample(when=when,
                             depth={k: counts[k] for k in DEPTH_STATES if k in counts},
                             succeeded=succeeded, failed=failed))
        minute = when - when % 60
        if q.minute is not None and minute > q.minute:
            self._keep(q, q.minute)
        q.minute = minute

    def _keep(self, q: _Queue, minute: float) -> None:
        """Write the point of ``minute``, which is over, into the control store (the
        sampler thread); a store that fails loses that point, logged once per outage."""
        point = q.history.point(q.data.queue, minute)
        if point is None:
            return
        try:
            q.data.put_history(point)
        except (Unavailable, Refused) as exc:
            if not q.keep_failing:
                log.warning("dashboard history: %s: not kept: %s", q.data.queue, exc)
            q.keep_failing = True
            return
        q.keep_failing = False

    def _workers_finished(self, q: _Queue) -> tuple[int | None, int | None]:
        """Tasks finished since the dashboard started, from the worker records (sampler
        thread); (None, None) while the control store cannot be read."""
        try:
            workers = q.data.workers(show_all=True)
        except Unavailable:
            return None, None
        seen: dict[str, tuple[int, int]] = {}
        for w in workers:
            done = w.get("finished") or {}
            now = (int(done.get("succeeded", 0)), int(done.get("failed", 0)))
            before = q.last.get(w["id"])
            if before is not None:  # a worker's first sight counts nothing: that was before
                for i in (0, 1):
                    q.grown[i] += now[i] - before[i] if now[i] >= before[i] else now[i]
            seen[w["id"]] = now
        q.last = seen  # purged workers drop out
        return q.grown[0], q.grown[1]

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.sample_once()
                self.stop.wait(self.interval)
        finally:
            for q in self._queues:
                q.data.close_thread()
