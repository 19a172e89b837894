"""Back-off and the outage lines of one store: the one helper of every place that retries a
failed call -- the control thread (fleet/agent.py), the output-store thread
(fleet/shipper.py), the main loop's receive (worker/pacing.py), the queue sampler
(worker/sampler.py), the backend's opening at start (worker/startup.py), a queue that
fails beside others (backends/multi.py) and SQLite's stale-lock reaper
(backends/sqlite/backend.py).

A failed call backs off from ``backoff_min`` doubling to ``backoff_max``.  The outage is
logged when it starts and, with ``repeat``, again at most every ``log_every`` seconds while
it lasts (without: once per outage, and a flapping store once per ``log_every`` at most).
Its end is declared only by ``succeeded``, which the caller calls after a store call that
answered -- never for a pass that made no call (a thread woken by other work), which would
log a recovery in the middle of an outage and reset the back-off.  A logged outage gets one
recovery line.  Each instance belongs to one thread.

The lines are ``UNAVAILABLE`` and ``REACHABLE`` unless a caller keeps its own words
(``warning``, ``recovery``; None: no recovery line): %-formats over the fields ``store``,
``call``, ``failures``, ``backoff``, ``effect`` ("; " and the effect, or nothing) and
``error``.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Optional

LOG_EVERY = 60.0
UNAVAILABLE = ("%(store)s unavailable (%(call)s failed, %(failures)d failure(s) so far; "
               "retrying in %(backoff).0fs%(effect)s): %(error)s")
REACHABLE = "%(store)s reachable again after %(failures)d failed call(s)"


class Outage:
    """``retry_at``: no store call before it (monotonic); ``backoff``: the current pause;
    ``failures``: failed calls since the last that succeeded."""

    def __init__(self, store: str, log: logging.Logger, clock: Callable[[], float], *,
                 backoff_min: float = 1.0, backoff_max: float = 30.0,
                 log_every: float = LOG_EVERY, repeat: bool = False,
                 effect: str = "", warning: str = UNAVAILABLE,
                 recovery: Optional[str] = REACHABLE) -> None:
        self.store = store  # "control store": the start of both lines
        self.log = log
        self.clock = clock
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.log_every = log_every
        self.repeat = repeat
        self.effect = effect  # what the outage does and does not do, for the warning
        self.warning = warning
        self.recovery = recovery
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
            self.log.warning(self.warning, self._fields(call, exc), exc_info=exc_info)
        return self.backoff

    def succeeded(self) -> None:
        """A store call answered: the outage, if any, is over.  Only after a real call."""
        if self.failures and self._logged and self.recovery is not None:
            self.log.info(self.recovery, self._fields("", ""))
        self.failures = 0
        self.backoff = 0.0
        self.retry_at = -math.inf
        self._logged = False

    def _fields(self, call: str, exc: object) -> dict[str, object]:
        return {"store": self.store, "call": call, "failures": self.failures,
                "backoff": self.backoff, "effect": f"; {self.effect}" if self.effect else "",
                "error": exc}
