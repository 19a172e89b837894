"""The result records a worker has not written yet: a bounded, coalescing outbox.

The main thread puts (``put``: a dict insert under a lock, never a wait); the control thread
takes everything waiting once it is due (``due``), writes it in one store call (``write``:
``batch``, then ``written``), or, when the write failed, leaves it for after its back-off
(``retry_at``).  A newer record of an attempt replaces one not written yet, so a short task's
"running" and end records become one write.  Beyond ``kept`` records the oldest are dropped
and counted (``dropped``): a dead control store must not grow the worker's memory.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Callable

from .control.base import ControlStore
from .control.records import ResultRecord
from .control.unique import release_final

log = logging.getLogger("jobq.control")

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
        self._drops_logged = 0
        self._drops_logged_at = -math.inf
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

    def write(self, store: ControlStore) -> bool:
        """Every waiting record in one store call, then the unique-key claims their final
        records release; whether a call was made (control thread).  Raises
        ControlStoreError: the records wait for the next try."""
        batch = self.batch()
        if not batch:
            return False
        store.put_results(list(batch.values()))
        self.written(batch)
        release_final(store, batch.values())
        return True

    def report_drops(self, every: float) -> None:
        """Log the records dropped so far, at most once per ``every`` s (control thread)."""
        dropped, now = self.dropped, self.clock()
        if dropped > self._drops_logged and now - self._drops_logged_at >= every:
            log.warning("control store: %d result record(s) dropped so far: the store could "
                        "not take them and %d were waiting (their tasks ran and were settled "
                        "as usual)", dropped, self.kept)
            self._drops_logged, self._drops_logged_at = dropped, now
