"""What goes on the main loop's event queue (worker/loop.py), and who puts it there.

* ``int`` -- a signal number, from the signal handlers (preemption.SignalQueue): a handler
  only ``put_nowait``\\s the number, nothing richer.
* ``SpawnJob`` -- a spawner thread is done with a job (worker/spawner.py, via the launcher).
* ``ScheduledEventChanged`` -- the Scheduled Events poller thread saw a Preempt/Terminate
  appear, change or go away (worker/lifecycle.py).
* ``ControlRequest`` -- the control thread (fleet/agent.py) saw the queue paused or
  resumed, or a drain/stop command for this worker.  A cancel does not come through here: the
  control thread sets it on the task and wakes the watchdog, as a lost lock does.
* ``Wake`` -- nothing to hand over, only "look again now": a task's output reached EOF (the
  output pump thread, via the launcher); the backend heard of new work (PostgreSQL's
  listener thread, through ``Backend.wake_with``).

A lost lock does not come through here: the keeper wakes the watchdog, which kills the task;
the main loop hears of the exit as a SIGCHLD and reaps it.

Plain data: whoever puts an event on the queue imports this module, never the other way
round (``PreemptEvent`` and ``TaskStart`` live here for that reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from ..backends.base import Lease
    from ..core.task import Task
    from ..fleet.control.records import Command
    from .keeper import LeaseKeeper
    from .spawner import SpawnJob


@dataclass(frozen=True)
class PreemptEvent:
    """A Preempt/Terminate for this VM, as the Scheduled Events poller read it
    (worker/preemption.py)."""

    event_id: str
    event_type: str
    not_before_wall: float | None  # epoch seconds; None: no time given

    def seconds_left(self, now_wall: float) -> float | None:
        """Seconds until NotBefore (never negative), or None when the event gave no time."""
        if self.not_before_wall is None:
            return None
        return max(0.0, self.not_before_wall - now_wall)


@dataclass(frozen=True)
class TaskStart:
    """The launcher's own bookkeeping on a spawn job (``SpawnJob.context``, worker/launch.py)."""

    lease: Lease
    task: Task  # lease.task, known not to be None
    keeper: LeaseKeeper
    max_attempts: int


@dataclass(frozen=True)
class Wake:
    """Look again now; nothing else to say."""


@dataclass(frozen=True)
class ScheduledEventChanged:
    """The Preempt/Terminate for this VM (None: it was cancelled)."""

    event: PreemptEvent | None


@dataclass(frozen=True)
class ControlRequest:
    """From the control thread: the pause flag changed (``paused``), or a command to act on
    and then acknowledge (``command``)."""

    paused: bool | None = None
    command: Command | None = None


WAKE = Wake()

Event = Union[int, "SpawnJob[TaskStart]", ScheduledEventChanged, ControlRequest, Wake]
