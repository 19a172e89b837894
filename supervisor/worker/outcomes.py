"""How an attempt ended, and what became of its settlement: the typed words that
worker/settlement.py
(which decides), the lease keeper (which applies the step) and the result log (which records
it) pass along, one way (docs/architecture.rst, "The settle path").

Main thread builds an ``Ended``; the keeper thread (or the main thread in
``LeaseKeeper.settle_here``) fills in the ``SettleResult``; the main thread reads it once the
keeper is done.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Ended(enum.Enum):
    """How an attempt ended, as settlement decided it.  The value of a counted outcome is the
    name of its count (``Settlement.counts``)."""

    SUCCEEDED = "succeeded"  # Complete
    RETRIED = "retried"  # Release, attempt counted, after the retry delay
    FAILED = "failed"  # DeadLetter: attempts used up, or not retried
    DEAD_LETTERED = "dead_lettered"  # DeadLetter without a run: a bad or refused message
    REQUEUED = "requeued"  # Release, attempt not counted: preempted, or the worker stopped
    CANCELLED = "cancelled"  # DeadLetter: a cancel, before or while it ran
    LOCK_LOST = "lock_lost"  # nothing settled: it comes back as Backend.lost_lease_return says
    RETURNED = "returned"  # Release, attempt not counted: received, never started
    EXPIRED = "expired"  # nothing settled: held ahead past its lease deadline, never started

    @property
    def count(self) -> str | None:
        """The count this outcome adds to, None for a lease that never started."""
        return None if self in (Ended.RETURNED, Ended.EXPIRED) else self.value


class Unsettled(enum.Enum):
    """Why a settlement did not happen (the message comes back as the backend's
    ``lost_lease_return`` says: a lock that lapses on Azure, a pass of ours on SQLite and
    PostgreSQL)."""

    REFUSED = "refused"  # the broker refused the settlement call (LeaseLost)
    LEASE_LOST = "lease lost"  # lost, or its deadline passed, before a call could succeed
    UNREACHABLE = "unreachable"  # every try failed: the service unreachable till the end


@dataclass(frozen=True)
class SettleResult:
    """What became of the settlement of an attempt that ``ended`` so: applied (or nothing to
    apply) when ``unsettled`` is None; else why not, and ``reason``, the words the log line
    and the result record use."""

    ended: Ended
    unsettled: Unsettled | None = None
    reason: str = ""

    @property
    def refused(self) -> bool:
        """The settlement did not happen: the run counts as a lost lease."""
        return self.unsettled is not None
