"""Settlement steps: what to do to a lease once its task is over.

Any thread builds one (worker/settlement.py, worker/launch.py); the lease's keeper thread
(worker/keeper.py), or the
main thread in ``LeaseKeeper.settle_here``, applies it: each ``apply`` is exactly one broker
call on the lease.  See docs/architecture.rst, "The settle path".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..backends.base import Lease
from ..core.task import storable


@dataclass(frozen=True)
class Complete:
    """The task succeeded: remove the message for good."""

    def apply(self, lease: Lease) -> None:
        lease.complete()


@dataclass(frozen=True)
class Release:
    """Put the message back, visible after ``delay`` seconds; ``count_attempt=False``
    (preemption, a lease received ahead and never started) gives the attempt back."""

    count_attempt: bool
    delay: float = 0.0

    def apply(self, lease: Lease) -> None:
        lease.release(count_attempt=self.count_attempt, delay=self.delay)


@dataclass(frozen=True)
class DeadLetter:
    """Give up on the message: failed state / dead-letter queue, with the reason."""

    reason: str
    tail: str = ""
    exit_status: int | None = None

    def apply(self, lease: Lease) -> None:
        # the reason may name an OS string (a path) and the tail is the task's own output
        lease.dead_letter(storable(self.reason), storable(self.tail), self.exit_status)


SettleStep = Union[Complete, Release, DeadLetter]
