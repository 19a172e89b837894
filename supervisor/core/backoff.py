"""Back-off and the outage lines of one store, shared by every thread that talks to one: the
control thread (control/agent.py), the output-store thread (outstore/shipper.py), the main
loop's receive (pacing.py) and the queue sampler (sampler.py).

A failed call backs off from ``backoff_min`` doubling to ``backoff_max``.  The outage is
logged when it starts and, with ``repeat``, again at most every ``log_every`` seconds while
it lasts (without: once per outage, and a flapping store once per ``log_every`` at most).
Its end is declared only by ``succeeded``, which the caller calls after a store call that
answered -- never for a pass that made no call (a thread woken by other work), which would
log a recovery in the middle of an outage and reset the back-off.  A logged outage gets one
recovery line.  Each instance belongs to one thread.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

LOG_EVERY = 60.0


class Outage:
    """``retry_at``: no store call before it (monotonic); ``backoff``: the current pause;
    ``failures``: failed calls since the last that succeeded."""

    def __init__(self, store: str, log: logging.Logger, clock: Callable[[], float], *,
                 backoff_min: float = 1.0, backoff_max: float = 30.0,
                 log_every: float = LOG_EVERY, repeat: bool = False,
                 effect: str = "") -> None:
        self.store = store  # "control store": the start of both lines
        self.log = log
        self.clock = clock
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.log_every = log_every
        self.repeat = repeat
        self.effect = effect  # what the outage does and does not do, for the warning
        self.retry_at = -math.inf
        self.backoff = 0.0
        self.failures = 0
        self._last_logged = -math.inf
        self._logged = False

    def failed(self, call: str, exc: object, exc_info: bool = False) -> float:
        """A ``call`` (e.g. "write") raised ``exc`` (or failed so: its text): the seconds to
        wait before the next."""
        self.failures += 1
        self.backoff = min(max(self.backoff_min, self.backoff * 2), self.backoff_max)
        now = self.clock()
        self.retry_at = now + self.backoff
        if (self.repeat or not self._logged) and now - self._last_logged >= self.log_every:
            self._last_logged = now
            self._logged = True
            effect = f"; {self.effect}" if self.effect else ""
            self.log.warning("%s unavailable (%s failed, %d failure(s) so far; retrying in "
                             "%.0fs%s): %s", self.store, call, self.failures, self.backoff,
                             effect, exc, exc_info=exc_info)
        return self.backoff

    def succeeded(self) -> None:
        """A store call answered: the outage, if any, is over.  Only after a real call."""
        if self.failures and self._logged:
            self.log.info("%s reachable again after %d failed call(s)", self.store,
                          self.failures)
        self.failures = 0
        self.backoff = 0.0
        self.retry_at = -math.inf
        self._logged = False
