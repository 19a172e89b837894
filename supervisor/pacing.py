"""When the main loop may call receive again: after a failure, and after the queue ran dry.

Main thread only (the worker's ``_receive``).  Two rules:

* A failed receive is retried with a back-off doubling from 1 s to ``BACKEND_RETRY_MAX``; an
  outage (a database gone read-only, a queue service down) is one log line a minute, not one
  per retry, and one more line when receiving works again.
* After a receive that left a slot empty (the queue ran dry), the next one waits while tasks
  are starting or settling -- short work this thread has to see through.  A receive on a
  long-polling backend (Service Bus) blocks this thread for its whole wait when the queue is
  empty, so calling it again at every reaped task held each of those up by a second, and
  a batch run's exit by a second per task that ended in the queue's last second (three in a
  1,000-task drain).  The hold ends at the latest a poll interval after the dry receive, so a
  settlement that hangs never stops the worker from receiving.
"""

from __future__ import annotations

import logging
import math

from .backends.base import BackendError

log = logging.getLogger("jobq.worker")  # the worker's lines, whoever writes them

BACKEND_RETRY_MAX = 10.0
RECEIVE_FAILURE_LOG_EVERY = 60.0  # s between two "receive failed" lines of one outage


class ReceivePacing:
    """The back-off of failed receives and the hold after a dry one (main thread)."""

    def __init__(self, poll_interval: float) -> None:
        self.poll_interval = poll_interval
        self.backoff = 0.0  # s before the next receive after a failure; 0 when the last worked
        self.failures = 0  # in a row
        self._failure_logged = -math.inf
        self._dry_until = -math.inf  # the hold after a dry receive ends by then

    def failed(self, now: float, exc: Exception) -> float:
        """A receive raised ``exc`` at ``now``: the seconds to wait before the next one."""
        self.backoff = min(max(1.0, self.backoff * 2), BACKEND_RETRY_MAX)
        self.failures += 1
        if now >= self._failure_logged + RECEIVE_FAILURE_LOG_EVERY:
            self._failure_logged = now
            log.warning("receive failed (%d time(s) in a row; retrying in %.0fs): %s",
                        self.failures, self.backoff, exc,
                        exc_info=not isinstance(exc, BackendError))
        return self.backoff

    def worked(self) -> None:
        """A receive returned (messages or none)."""
        if self.failures:
            log.info("receive works again after %d failure(s)", self.failures)
            self.failures, self._failure_logged = 0, -math.inf
        self.backoff = 0.0

    def ran_dry(self, now: float) -> None:
        """A receive that returned at ``now`` left a slot empty."""
        self._dry_until = now + self.poll_interval

    def filled(self) -> None:
        """A receive filled every slot it asked for: the queue has work again."""
        self._dry_until = -math.inf

    def holds(self, now: float, settling_or_starting: bool) -> bool:
        """True while the next receive should wait for tasks starting or settling."""
        return settling_or_starting and now < self._dry_until
