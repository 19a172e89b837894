"""When the main loop may call receive again: after a failure, after the queue ran dry, and
when short tasks are about to free their slots.

Main thread only (the worker's ``_receive``).  Three rules:

* A failed receive is retried with a back-off doubling from 1 s to ``BACKEND_RETRY_MAX``; an
  outage (a database gone read-only, a queue service down) is one log line a minute, not one
  per retry, and one more line when a receive answers again (core/backoff.py).
* After a receive that left a slot empty (the queue ran dry), the next one waits while tasks
  are starting or settling -- short work this thread has to see through.  A receive on a
  long-polling backend (Service Bus) blocks this thread for its whole wait when the queue is
  empty, so calling it again at every reaped task held each of those up by a second, and
  a batch run's exit by a second per task that ended in the queue's last second (three in a
  1,000-task drain).  The hold ends at the latest a poll interval after the dry receive, so a
  settlement that hangs never stops the worker from receiving.
* Gathering, for a backend that does not receive ahead (Service Bus): a receive blocks this
  thread for a round trip and asks for the slots free at that moment.  With short tasks and
  a slow link, the slots freed one or two at a time, so each receive took one or two
  messages while the tasks just started would end before it came back (-n 4 at a ~10 ms
  round trip: ~2 messages a receive, ~110 tasks/s).  So while a busy slot's task is
  expected to end within half a receive (``GATHER_SHARE`` of the recent receives' time, at
  most ``GATHER_MAX``), the receive waits for it -- that long at most from when it began
  to wait, then it receives for what is free: one receive fills those slots too.  Nothing
  is held, so no lease is at risk; a task that runs longer than expected costs at most that
  wait.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

from ..backends.base import BackendError
from ..core.backoff import Outage

log = logging.getLogger("jobq.worker")  # the worker's lines, whoever writes them

BACKEND_RETRY_MAX = 10.0
GATHER_SHARE = 0.5  # of a receive's time: the longest a receive waits for slots to free
GATHER_MAX = 0.05  # s: ... and never longer
RECEIVE_FAILURE_LOG_EVERY = 60.0  # s between two "queue unavailable" lines of one outage


class ReceivePacing:
    """The back-off of failed receives and the hold after a dry one (main thread)."""

    def __init__(self, poll_interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.poll_interval = poll_interval
        self.outage = Outage("queue", log, clock, backoff_max=BACKEND_RETRY_MAX,
                             log_every=RECEIVE_FAILURE_LOG_EVERY, repeat=True)
        self._dry_until = -math.inf  # the hold after a dry receive ends by then
        self.receive_time: float | None = None  # moving average of receives that filled
        self.gather_until: float | None = None  # the receive waits for slots until then

    @property
    def backoff(self) -> float:
        """s before the next receive after a failure; 0 when the last worked."""
        return self.outage.backoff

    @property
    def failures(self) -> int:
        """Failed receives in a row."""
        return self.outage.failures

    def failed(self, exc: Exception) -> float:
        """A receive raised ``exc``: the seconds to wait before the next one."""
        return self.outage.failed("receive", exc, exc_info=not isinstance(exc, BackendError))

    def worked(self) -> None:
        """A receive returned (messages or none): the only proof that the queue answers."""
        self.outage.succeeded()

    def ran_dry(self, now: float) -> None:
        """A receive that returned at ``now`` left a slot empty."""
        self._dry_until = now + self.poll_interval

    def filled(self, seconds: float) -> None:
        """A receive that took ``seconds`` filled every slot it asked for: the queue has work
        again.  Only such receives time a round trip: one that got fewer waited for more."""
        self._dry_until = -math.inf
        r = self.receive_time
        self.receive_time = seconds if r is None else 0.8 * r + 0.2 * seconds

    def gather(self, now: float, ends: list[float]) -> bool:
        """True while the receive should wait for busy slots to free (the gathering rule);
        ``ends``: when each busy slot's task is expected to end (empty: none busy, or their
        duration not known yet).  ``gather_until`` is then when to look again at the latest."""
        if self.gather_until is not None and now >= self.gather_until:
            self.gather_until = None
            return False  # waited long enough: receive now (the next one may gather again)
        horizon = now + min(GATHER_MAX, GATHER_SHARE * (self.receive_time or 0.0))
        soon = [end for end in ends if end <= horizon]
        if not soon or self.receive_time is None:
            self.gather_until = None
            return False
        if self.gather_until is None:
            # Not the expected ends themselves: a task is seen to end when it is reaped, a
            # little after them; the wait ends anyway as soon as none busy is expected.
            self.gather_until = horizon
        return True

    def holds(self, now: float, settling_or_starting: bool) -> bool:
        """True while the next receive should wait for tasks starting or settling."""
        return settling_or_starting and now < self._dry_until
