"""What the control records tell one worker, and what it does with them (``Directives``): the
cancels of its queue, the queue's pause flag, and the drain/stop commands sent to this worker
-- read by one poll of the control store (fleet/agent.py calls ``poll`` on its thread) and
applied at once, and the commands the main loop carried out acknowledged (``flush``).

It never signals a process and never touches a lease.  A cancel for a running task becomes a
request on its ``RunningTask`` (``cancel``) and a wake-up of the watchdog, exactly like a lock
loss; a pause flag or a drain/stop command is handed to the worker's ``on_paused`` /
``on_command``, which put it on the main loop's queue (callbacks: the fleet layer never
imports the worker).  Cancels seen are kept in ``cancels`` (task id -> Cancel), which the
launcher reads at claim time with a dict lookup: no store call on the main thread, ever.
Unsigned or wrongly signed records are dropped where keys are set (control/signing.py).
"""

from __future__ import annotations

import logging
import math
import queue
from collections.abc import Sequence
from typing import Callable, Union

from .control.base import ControlStore, ControlStoreError
from .control.records import Cancel, Command
from .control.signing import Gate
from .worker_record import RunningTaskView

log = logging.getLogger("jobq.control")

# Every this often a poll starts over (cursor None: every live cancel) and the local cache is
# replaced by its answer: a cancel deleted from the store (a task requeued after it) stops
# applying here within a minute.  It costs no extra call, only a bigger answer.
REFRESH_EVERY = 60.0


class Directives:
    """The cancels, pause flag and commands of one worker on one queue.  ``poll``, ``flush``
    and ``expire`` run on the control thread, ``acted`` on the main thread; ``paused`` and
    ``cancels`` are written by the control thread only and read anywhere."""

    def __init__(self, *, queue_name: str, worker_id: str, started_wall: float,
                 gate: Gate, on_paused: Callable[[bool], None],
                 on_command: Callable[[Command], None], wake_watchdog: Callable[[], None],
                 tasks: Callable[[], Sequence[RunningTaskView]],
                 clock: Callable[[], float], wall: Callable[[], float]) -> None:
        self.queue = queue_name
        self.worker_id = worker_id
        self.started_wall = started_wall  # a command older than this worker is obsolete
        self.gate = gate
        self.on_paused = on_paused  # the queue's pause flag changed (control thread)
        self.on_command = on_command  # a drain/stop command for this worker (control thread)
        self.wake_watchdog = wake_watchdog
        self.tasks = tasks  # the worker's running tasks, a snapshot
        self.clock = clock
        self.wall = wall
        self.paused = False
        self.cancels: dict[str, Cancel] = {}
        self.cursor: Union[str, None] = None
        self._next_refresh = -math.inf
        self._seen_commands: set[str] = set()
        self._acted: queue.SimpleQueue[Command] = queue.SimpleQueue()

    def acted(self, command: Command) -> None:
        """The main loop carried out ``command``: acknowledge it at the next flush (main
        thread)."""
        self._acted.put(command)

    def flush(self, store: ControlStore) -> bool:
        """Acknowledge what the main loop acted on; whether a store call was made (control
        thread).  Raises ControlStoreError (what is left waits for the next flush)."""
        called = False
        while True:
            try:
                command = self._acted.get_nowait()
            except queue.Empty:
                return called
            try:
                store.ack_command(command)
            except ControlStoreError:
                self._acted.put(command)  # next time
                raise
            called = True

    def poll(self, store: ControlStore) -> bool:
        """One poll of the queue's records, applied; whether the worker's state changed (its
        record is due at once).  Raises ControlStoreError (control thread)."""
        refresh = self.clock() >= self._next_refresh
        snap = store.poll(self.queue, self.worker_id, None if refresh else self.cursor)
        self.cursor = snap.cursor
        wall = self.wall()
        live = {c.task_id: c for c in self.gate.filter(list(snap.cancels))
                if c.queue == self.queue and c.expires() > wall}
        if refresh:  # in place: the launcher holds this very dict
            for task_id in [t for t in self.cancels if t not in live]:
                self.cancels.pop(task_id, None)
            self._next_refresh = self.clock() + REFRESH_EVERY
        self.cancels.update(live)
        changed = False
        paused = bool(snap.flag is not None and snap.flag.queue == self.queue
                      and self.gate.accepts(snap.flag) and snap.flag.paused)
        if paused != self.paused:
            self.paused = paused
            who = snap.flag.who if snap.flag is not None else "?"
            log.warning("queue %s %s by %s: %s", self.queue,
                        "paused" if paused else "resumed", who,
                        "no new task starts here; running ones go on" if paused
                        else "taking tasks again")
            self.on_paused(paused)
            changed = True
        for command in self.gate.filter(list(snap.commands)):
            self._command(command)
        self._apply_cancels()
        return changed

    def _command(self, command: Command) -> None:
        # The queue too, as for cancels and the flag: a command signed for another queue and
        # moved into this one's records is not this queue's to act on (issue 39).
        if (command.worker != self.worker_id or command.queue != self.queue
                or command.seq in self._seen_commands):
            return
        self._seen_commands.add(command.seq)
        if command.when < self.started_wall:
            log.info("control: ignoring %s command %s from %s: older than this worker",
                     command.action, command.seq, command.who)
            self._acted.put(command)
            return
        log.warning("control: %s command from %s", command.action, command.who)
        self.on_command(command)

    def _apply_cancels(self) -> None:
        """Set a cancel request on each running task that has one (control thread)."""
        self.expire()
        if not self.cancels:
            return
        woke = False
        for rt in self.tasks():
            cancel = self.cancels.get(rt.task_id)
            if cancel is not None and rt.cancel is None and rt.exited_at is None:
                rt.cancel = cancel
                log.warning("cancelled by %s: %s (grace %gs)", cancel.who,
                            cancel.reason or "no reason given", cancel.grace,
                            extra={"task_id": rt.task_id})
                woke = True
        if woke:
            self.wake_watchdog()

    def expire(self) -> float:
        """Drop the cancels past their ttl from the cache (so the launcher's claim-time lookup
        no longer finds them); the epoch time of the next expiry, inf if none (control
        thread)."""
        now, soonest = self.wall(), math.inf
        for task_id, cancel in list(self.cancels.items()):
            expires = cancel.expires()
            if expires <= now:
                self.cancels.pop(task_id, None)
            else:
                soonest = min(soonest, expires)
        return soonest
