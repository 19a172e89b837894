"""What goes on the main loop's event queue (worker.py), and who puts it there.

* ``int`` -- a signal number, from the signal handlers (preemption.SignalQueue): a handler
  only ``put_nowait``\\s the number, nothing richer.
* ``SpawnJob`` -- a spawner thread is done with a job (spawner.py, via the launcher).
* ``ScheduledEventChanged`` -- the Scheduled Events poller thread saw a Preempt/Terminate
  appear, change or go away (lifecycle.py).
* ``ControlRequest`` -- the control thread (control/agent.py) saw the queue paused or
  resumed, or a drain/stop command for this worker.  A cancel does not come through here: the
  control thread sets it on the task and wakes the watchdog, as a lost lock does.
* ``Wake`` -- nothing to hand over, only "look again now": a task's output reached EOF (the
  output pump thread, via the launcher).

A lost lock does not come through here: the keeper wakes the watchdog, which kills the task;
the main loop hears of the exit as a SIGCHLD and reaps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from ..fleet.control.records import Command
    from .launch import TaskStart
    from .preemption import PreemptEvent
    from .spawner import SpawnJob


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

# Names only, not imports: this module is imported by the modules it names.
Event = Union[int, "SpawnJob[TaskStart]", ScheduledEventChanged, ControlRequest, Wake]
