"""When a worker purges the succeeded tasks past ``--retention`` from a queue that keeps them
(``keeps_succeeded``: SQLite, PostgreSQL), and how long one pass may take: the schedule is the
same for both, the batch statement each backend's own (sqlite/retention.py,
postgres/retention.py).

A pass (the main thread, from the backend's ``maintenance``) deletes batch after batch for at
most ``budget`` seconds: a backlog (the first run after an upgrade) goes on ``PURGE_AGAIN``
seconds later instead of holding the main loop; with nothing more due, the next pass is an
``interval`` later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Generic, Protocol, TypeVar

from ..core.settings import format_duration
from .base import BackendError

PURGE_BUDGET = 0.05  # s of one maintenance pass spent purging
PURGE_AGAIN = 1.0  # s to the next pass while more rows are due


class Clocks(Protocol):
    """The backend's clocks, read at each pass (tests inject them after the backend opened)."""

    clock: Callable[[], float]  # monotonic: the schedule
    wall: Callable[[], float]  # wall clock: the age of a row


Q = TypeVar("Q", bound=Clocks)


def purge_all(purge_batch: Callable[[Q, float, int], int], backend: Q, before: float,
              batch: int) -> int:
    """Every task that succeeded before ``before``, batch after batch; how many (jobq-ctl
    prune)."""
    total = 0
    while True:
        n = purge_batch(backend, before, batch)
        total += n
        if n < batch:
            return total


@dataclass
class Purger(Generic[Q]):
    """``retention`` 0 or ``interval`` 0 (``--reaper-interval 0``): never.  ``purge_batch``
    deletes up to ``batch`` rows that succeeded before a wall-clock time and says how many
    (raises BackendError)."""

    backend: Q
    retention: float
    interval: float
    purge_batch: Callable[[Q, float, int], int]
    batch: int
    log: logging.Logger
    budget: float = PURGE_BUDGET
    next_at: float = 0.0  # the first maintenance pass purges

    def maintenance(self) -> int:
        """Purge what is due, for at most ``budget`` seconds; how many rows went (main
        thread).  A failure is logged and tried again at the next interval."""
        if not self.retention or not self.interval:
            return 0
        clock = self.backend.clock
        start = clock()
        if start < self.next_at:
            return 0
        before = self.backend.wall() - self.retention
        total, more = 0, False
        try:
            while True:
                n = self.purge_batch(self.backend, before, self.batch)
                total += n
                more = n == self.batch
                if not more or clock() - start >= self.budget:
                    break
        except BackendError as exc:
            self.log.warning("purge of succeeded tasks skipped this round (next try in "
                             "%.0fs): %s", self.interval, exc)
        if total:
            self.log.info("purged %d succeeded task(s) older than %s%s", total,
                          format_duration(self.retention), ", more to go" if more else "")
        self.next_at = start + (PURGE_AGAIN if more else self.interval)
        return total
