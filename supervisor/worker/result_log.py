"""Result records of this worker's attempts, as settlement decides them (main thread).

Each attempt gets a ``ResultRecord`` (fleet/control/records.py) when it starts (state ``running``)
and one when it ends, under the same key (task id, attempt): ``succeeded``, ``failed``,
``cancelled``, ``lock-lost`` or ``requeued``, with the exit status or the signal that ended
the shell, the wall-clock start and end, and ``final`` when the task ended for good.  A
record is handed to ``sink`` -- the control agent's ``result``, a queue append: the control
thread writes it, batched, so nothing here ever waits for a store.  Without a control store
``sink`` is None and no record is even built.

A settlement that did not happen after the end record was handed over -- the broker refused
it, or the service could not be reached until the lease ended -- leaves the message to come
back.  Settlement tells ``settled`` so (the keeper's ``SettleResult``), which then hands over
the same record again as ``lock-lost``, not final (an upsert of the same key), its reason
saying what was decided and why it was not settled.  The result log is only told: it decides
nothing and asks nobody.
See docs/architecture.rst, "The fleet layer".
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Union

from .outcomes import SettleResult

if TYPE_CHECKING:  # imported at the first record: a worker without a control store needs none
    from ..fleet.control.records import ResultRecord

TAIL_CHARS = 4000  # output kept with a failed or cancelled attempt (others: none, for cost)


def exit_parts(rc: Union[int, None]) -> tuple[Union[int, None], Union[int, None]]:
    """(exit status, signal) of a shell's return code: a negative one is a signal (any
    thread)."""
    if rc is None:
        return None, None
    return (None, -rc) if rc < 0 else (rc, None)


@dataclass(eq=False)
class ResultLog:
    """Builds result records and remembers the end records whose settlement is not yet
    known (main thread only).  ``clock`` is the monotonic clock of ``RunningTask.started``;
    ``wall`` the epoch time written."""

    queue: str
    worker_id: str
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sink: Union[Callable[[ResultRecord], None], None] = field(default=None, init=False)
    # the end records whose settlement is not known yet, by settlement (its keeper)
    _unsettled: dict[Hashable, ResultRecord] = field(default_factory=dict, init=False)
    # task id -> its queue, when not ``queue``
    _queues: dict[str, str] = field(default_factory=dict, init=False)

    def note_queue(self, task_id: str, queue: str) -> None:
        """The task came from ``queue``, one of the worker's several (launcher, at dispatch):
        its records say so until its attempt's end record."""
        if self.sink is not None:
            self._queues[task_id] = queue

    def epoch(self, mono: Union[float, None]) -> Union[float, None]:
        """The wall-clock time of monotonic ``mono``."""
        return None if mono is None else self.wall() - (self.clock() - mono)

    def started(self, task_id: str, attempt: int, max_attempts: int, at: float) -> None:
        """An attempt's shell started at ``at`` (monotonic)."""
        if self.sink is not None:
            from ..fleet.control.records import ResultRecord

            self.sink(ResultRecord(queue=self._queues.get(task_id, self.queue),
                                   task_id=task_id, attempt=attempt, outcome="running",
                                   reason="", tail="", exit_status=None,
                                   worker=self.worker_id, when=self.wall(),
                                   started=self.epoch(at), max_attempts=max_attempts))

    def ended(self, task_id: str, attempt: int, outcome: str, *, max_attempts: int,
              rc: Union[int, None] = None, final: bool = False, reason: str = "",
              tail: str = "", cancelled_by: str = "",
              started: Union[float, None] = None) -> Union[ResultRecord, None]:
        """The end record of an attempt (None without a sink); ``started``: monotonic, None
        if it never ran.  Handed over by ``hand_over`` once the settlement is under way."""
        if self.sink is None:
            return None
        from ..fleet.control.records import ResultRecord

        status, sig = exit_parts(rc)
        now = self.wall()
        keep_tail = outcome in ("failed", "cancelled")
        return ResultRecord(queue=self._queues.pop(task_id, self.queue), task_id=task_id,
                            attempt=attempt,
                            outcome=outcome, reason=reason,
                            tail=tail[-TAIL_CHARS:] if keep_tail else "",
                            exit_status=status, signal=sig, worker=self.worker_id, when=now,
                            started=self.epoch(started), finished=now, final=final,
                            max_attempts=max_attempts, cancelled_by=cancelled_by)

    def hand_over(self, record: Union[ResultRecord, None], unique_key: Union[str, None],
                  settlement: Hashable) -> None:
        """Give ``record`` to the sink, as its attempt's settlement (its keeper) is under way:
        what became of it comes to ``settled``.  ``unique_key``: the task's, released with
        a final record."""
        if record is None or self.sink is None:
            return
        if record.final and unique_key:
            # the control thread releases the key's claim (fleet/control/unique.py)
            record = replace(record, unique_key=unique_key)
        self.sink(record)
        if record.outcome != "lock-lost":
            self._unsettled[settlement] = record

    def settled(self, settlement: Hashable, result: SettleResult) -> None:
        """``settlement`` (handed over with its record) is over with ``result``; when it was
        refused (the message comes back) the end record says lock-lost, with what was
        decided and why it did not happen."""
        record = self._unsettled.pop(settlement, None)
        if record is None or not result.refused or self.sink is None:
            return
        why = result.reason or "the broker refused the settlement"
        self.sink(replace(record, outcome="lock-lost", final=False, when=self.wall(),
                          reason=f"{record.outcome}, then {why}; the message comes back and "
                                 f"the task runs again"
                                 + (f" [{record.reason}]" if record.reason else "")))
