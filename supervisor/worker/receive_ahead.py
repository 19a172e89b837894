"""Receive-ahead of short tasks: how many leases a receive may take beyond the free slots, and
what becomes of a lease held for the next free slot (docs/reliability.rst, "The life of one
task").

Main thread only (the Launcher's).  This module decides; the Launcher acts: it starts a held
lease, gives it back (``Release(count_attempt=False)``: visible at once, attempt not counted)
or lets it go as lost (never settled: the broker brings it back).

The rules, for every held lease (received at ``t_sent`` with ``granted`` seconds of lock):

* it may start only before ``t_sent + hold_bound`` -- ``hold_bound`` = min(HOLD_MAX, lock/8),
  well before the lease's first renewal would be due (a held lease has no keeper thread) --
  and before ``deadline - hold_bound``, ``deadline`` being the lease deadline
  (``lease.lease_deadline``): a broker that granted less than asked (a Service Bus queue's own
  lock duration) still leaves a started task time to be spawned and renewed;
* past that it goes back at once, uncounted -- unless its deadline has passed too: a lease
  past its deadline is never settled nor started (the broker hands the message out again).

How many to hold: while tasks are short (moving average of their run time <= SHORT_TASK), as
many as the slots will start within half the hold bound (``slots * hold_bound * HOLD_SHARE /
cycle``), and never more than one receive may take (``Backend.max_receive``; a backend
without a limit of its own: one per slot, which is all a cheap receive needs).  Held work is
work other workers of a fleet cannot have: it must start soon or go back.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from ..backends.base import Lease
from .keeper import lease_deadline

SHORT_TASK = 0.5  # s: receive ahead only while tasks run this short on average
HOLD_MAX = 2.0  # s: the longest a lease waits for a slot (less for a lock under 16 s)
# Size a receive so the held leases start within this share of the hold bound: run times
# vary, and a held lease that goes back unstarted has cost two calls for nothing.
HOLD_SHARE = 0.5
# A slot's shortest cycle (spawn, run, reap) assumed when sizing: a task that runs 1 ms still
# costs the supervisor a few ms to start and reap, so its run time alone would hold too many.
MIN_CYCLE = 0.02

START = "start"
RELEASE = "release"  # back to the queue at once, attempt not counted
LOST = "lost"  # past its lease deadline: neither started nor settled


@dataclass(frozen=True)
class Held:
    """A lease received ahead and not started yet."""

    lease: Lease
    t_sent: float  # monotonic time its receive was sent
    start_until: float  # it may start before this
    deadline: float  # its lease deadline: no call on it from then on


class ReceiveAhead:
    """The leases held for the next free slot, and the rules above (main thread only)."""

    def __init__(self, *, lock: float, slots: int, can_hold: bool, max_receive: int | None,
                 clock: Callable[[], float]) -> None:
        self.slots = slots
        self.can_hold = can_hold
        self.max_receive = max_receive
        self.clock = clock
        # Well before the lease's first renewal would be due: a held lease has no thread.
        self.hold_bound = min(HOLD_MAX, lock / 8)
        self.ready: collections.deque[Held] = collections.deque()
        self.recent_duration: float | None = None  # moving average of tasks' run times

    def extra(self, free: int) -> int:
        """How many leases a receive for ``free`` slots may take beyond them."""
        d = self.recent_duration
        if not self.can_hold or d is None or d > SHORT_TASK:
            return 0
        startable = int(self.slots * self.hold_bound * HOLD_SHARE / max(d, MIN_CYCLE))
        cap = self.slots if self.max_receive is None else self.max_receive - free
        return max(0, min(startable, cap) - len(self.ready))

    def note_duration(self, seconds: float) -> None:
        """A task ran this long."""
        r = self.recent_duration
        self.recent_duration = seconds if r is None else 0.8 * r + 0.2 * seconds

    def hold(self, leases: Sequence[Lease], t_sent: float) -> None:
        for lease in leases:
            deadline = lease_deadline(t_sent, lease.lock_duration)
            until = min(t_sent + self.hold_bound, deadline - self.hold_bound)
            self.ready.append(Held(lease, t_sent, until, deadline))

    def next_due(self) -> float:
        """When the first held lease must go back (inf: none held)."""
        return min((h.start_until for h in self.ready), default=math.inf)

    def due(self, now: float) -> list[tuple[Held, str]]:
        """Take out the held leases that may no longer start at ``now``, each with what to do
        with it (RELEASE or LOST)."""
        if self.next_due() > now:
            return []
        gone = [(h, verdict(h, now)) for h in self.ready if now >= h.start_until]
        self.ready = collections.deque(h for h in self.ready if now < h.start_until)
        return gone

    def pop(self, now: float) -> tuple[Held, str] | None:
        """The oldest held lease and what to do with it at ``now`` (None: none held)."""
        if not self.ready:
            return None
        h = self.ready.popleft()
        return h, START if now < h.start_until else verdict(h, now)

    def pop_all(self, now: float) -> list[tuple[Held, str]]:
        """Every held lease, none to start (the worker stops, drains, pauses or is preempted)."""
        gone = [(h, verdict(h, now)) for h in self.ready]
        self.ready.clear()
        return gone


def verdict(held: Held, now: float) -> str:
    """A held lease that will not start: back to the queue, or lost once past its deadline."""
    return RELEASE if now < held.deadline else LOST
