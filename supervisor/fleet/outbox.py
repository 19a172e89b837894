"""The result records a worker has not written yet: a bounded, coalescing outbox.

The main thread puts (``put``: a dict insert under a lock, never a wait); the control thread
takes everything waiting once it is due (``due``, ``batch``), writes it in one store call and
marks it written (``written``), or, when the write failed, leaves it for after its back-off
(``retry_at``).  A newer record of an attempt replaces one not written yet, so a short task's
"running" and end records become one write.  Beyond ``kept`` records the oldest are dropped
and counted (``dropped``): a dead control store must not grow the worker's memory.
"""

from __future__ import annotations

import math
import threading
from typing import Callable

from .control.records import ResultRecord

# ~300 bytes a record, ~4 KB with an output tail (failed and cancelled attempts only)
RESULTS_KEPT = 5000
# A record waits this long for others to share its write: one transaction for a busy
# worker's many records, and one upsert for a short task's two.
RESULT_DELAY = 0.5
# The same when the store pushes each write to its readers (PostgreSQL with NOTIFY:
# ``push --wait`` returns within ~0.3 s of a task's end instead of ~0.7 s)
LIVE_RESULT_DELAY = 0.1

Key = tuple[str, int]


class Outbox:
    """Waiting result records, keyed by (task id, attempt).  ``put`` from any thread (the
    main thread); the rest from the control thread."""

    def __init__(self, clock: Callable[[], float], kept: int = RESULTS_KEPT,
                 delay: float = RESULT_DELAY) -> None:
        self.clock = clock
        self.kept = kept
        self.delay = delay
        self.dropped = 0
        self.retry_at = -math.inf  # after a failed write: not before then
        self._waiting: dict[Key, ResultRecord] = {}
        self._since = 0.0  # clock() when the oldest waiting record came
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, record: ResultRecord) -> bool:
        """Queue ``record``; True if nothing was waiting (the control thread sleeps until
        the first record is ``delay`` old, so the caller wakes it)."""
        key = (record.task_id, record.attempt)
        with self._lock:
            first = not self._waiting
            if first:
                self._since = self.clock()
            self._waiting.pop(key, None)
            self._waiting[key] = record
            if len(self._waiting) > self.kept:
                del self._waiting[next(iter(self._waiting))]
                self.dropped += 1
        return first

    def due(self) -> float:
        """When what waits is to be written (clock() time); inf if nothing waits."""
        with self._lock:
            if not self._waiting:
                return math.inf
            return max(self._since + self.delay, self.retry_at)

    def batch(self) -> dict[Key, ResultRecord]:
        with self._lock:
            return dict(self._waiting)

    def written(self, batch: dict[Key, ResultRecord]) -> None:
        """``batch`` is stored: forget its records, except those replaced meanwhile."""
        with self._lock:
            for key, record in batch.items():
                if self._waiting.get(key) is record:
                    del self._waiting[key]
            self._since = self.clock()
