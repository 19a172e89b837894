"""Back-off and the outage lines of the output-store thread (shipper.py).

A failed store call backs off BACKOFF_MIN doubling to BACKOFF_MAX; an outage is logged once
(a flapping store once a minute at most), its end once.  Output-store thread only.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

log = logging.getLogger("jobq.output")

BACKOFF_MIN, BACKOFF_MAX = 1.0, 30.0
LOG_EVERY = 60.0  # one line per outage, and of a flapping store one a minute at most


class Outage:
    """``retry_at``: no store call before it (monotonic); ``backoff``: the current pause."""

    def __init__(self, clock: Callable[[], float], buffer_limit: int) -> None:
        self.clock = clock
        self.buffer_limit = buffer_limit  # for the warning
        self.retry_at = -math.inf
        self.backoff = 0.0
        self.failures = 0
        self._last_logged = -math.inf
        self._logged = False

    def failed(self, what: str, exc: Exception) -> None:
        self.failures += 1
        self.backoff = min(max(BACKOFF_MIN, self.backoff * 2), BACKOFF_MAX)
        now = self.clock()
        self.retry_at = now + self.backoff
        if not self._logged and now - self._last_logged >= LOG_EVERY:
            self._last_logged = now
            self._logged = True
            log.warning("output store unavailable: %s (%s failed, %d failure(s) so far; "
                        "retrying in %.0fs; output is held up to %d bytes, then dropped with "
                        "a marker; tasks and leases are not affected)", exc, what,
                        self.failures, self.backoff, self.buffer_limit)

    def recovered(self) -> None:
        # Only a logged outage gets its recovery line: a flapping store stays at one warning
        # a minute.
        if self.failures and self._logged:
            log.info("output store reachable again after %d failed call(s)", self.failures)
        self.failures = 0
        self.backoff = 0.0
        self.retry_at = -math.inf
        self._logged = False
