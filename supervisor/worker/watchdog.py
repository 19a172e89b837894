"""The watchdog: the one thread that signals tasks.

It acts on lock loss (the keeper's event, or its monotonic deadline passing -- a hung renewal
never delays the kill), cancels (set on the task by the control thread), time limits,
stop/kill requests from the main loop (preemption, shutdown), SIGTERM -> SIGKILL escalation,
and leftovers of a task whose shell has exited.
It never talks to the backend, and reaches processes only through its ``Signaller``
(worker/process.py), which unit tests replace with a fake.  Escalation is explicit state, each
transition made once: RUNNING -> TERMINATING(deadline = now + kill_timeout) -> KILLED.
"""

from __future__ import annotations

import enum
import logging
import math
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..core.threads import Flag, start_thread
from .keeper import LeaseKeeper
from .process import Signaller, TaskProcess

if TYPE_CHECKING:  # names only: a worker without a control store loads none of fleet/
    from ..backends.base import Lease
    from ..core.task import Task
    from ..fleet.control.records import Cancel

log = logging.getLogger("jobq.watchdog")

LEFTOVER_GRACE = 2.0  # SIGTERM -> SIGKILL for processes left behind by an exited shell
MAX_SLEEP = 1.0


class Escalation(enum.Enum):
    RUNNING = "running"
    TERMINATING = "terminating"
    KILLED = "killed"


@dataclass(eq=False)
class RunningTask:
    """A task between spawn and cleanup.  Fields marked (main) are written by the main thread
    only, (watchdog) by the watchdog only; the others are set once at creation."""

    task_id: str
    attempt: int
    proc: TaskProcess
    keeper: LeaseKeeper
    started: float
    lease: Lease
    time_limit_at: float | None = None
    time_limit: float | None = None  # s: min(the task's timeout, --task-time-limit)
    task: Task | None = None  # lease.task (None only in tests)
    # requests (main)
    stop_reason: str | None = None  # e.g. "preempted": SIGTERM, escalate after kill_timeout
    stop_kill_timeout: float | None = None  # escalate after this instead (Scheduled Events)
    kill_reason: str | None = None  # e.g. "second signal": SIGKILL now
    exited_at: float | None = None  # the shell was reaped
    # request (control thread, set once): SIGTERM to the tree, SIGKILL after its grace (0: at
    # once); settled as "cancelled"
    cancel: Cancel | None = None
    # state (watchdog)
    state: Escalation = Escalation.RUNNING
    term_reason: str | None = None
    term_deadline: float | None = None
    lock_loss_handled: bool = False
    cancel_handled: bool = False  # the cancel was carried out while the shell ran
    term_grace: float | None = None  # SIGTERM -> SIGKILL of a cancel (its own grace)
    cleanup_deadline: float | None = None
    clean: Flag = field(default_factory=Flag)


class Watchdog:
    """Runs on its own thread (``start``); ``add``, ``remove`` and ``wake`` from any thread.
    Every signal goes through ``signaller`` (the real OS calls unless a test gives a fake)."""

    def __init__(self, *, kill_timeout: float, lock_lost_behavior: str,
                 clock: Callable[[], float] = time.monotonic,
                 exclude_pids: Callable[[], set[int]] = set,
                 signaller: Signaller | None = None) -> None:
        self.kill_timeout = kill_timeout
        self.lock_lost_signal = signal.SIGTERM if lock_lost_behavior == "sigterm" \
            else signal.SIGKILL
        self.clock = clock
        self._exclude = exclude_pids
        self.signaller = signaller if signaller is not None else Signaller()
        self._tasks: dict[str, RunningTask] = {}
        self._lock = threading.Lock()
        # Sleeps on a C-level queue: waking it costs one put, not an Event's Condition.
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        # When the current sleep ends; +inf while a tick runs (it may have listed the tasks
        # already, so every add() then wakes the thread).  Written by the watchdog thread.
        self._next_check = math.inf
        self._stop = threading.Event()
        # Read by the main thread, so that it need not scan every exited task each turn:
        self.cleaned_count = 0  # bumped whenever an exited task's tree is found gone
        self.cleanup_busy = False  # leftovers of an exited shell are being signalled
        self._thread: threading.Thread | None = None

    # -- any thread ----------------------------------------------------------------------
    def add(self, rt: RunningTask) -> None:
        """Watch a new task; wake the thread only if the task is due before its next check
        (waking it for every start cost a thread switch per task)."""
        with self._lock:
            self._tasks[rt.proc.marker] = rt
        due = min(rt.keeper.deadline, rt.time_limit_at if rt.time_limit_at is not None
                  else math.inf)
        if rt.stop_reason or rt.kill_reason or due <= self._next_check:
            self._wake.put(None)

    def remove(self, rt: RunningTask) -> None:
        with self._lock:
            self._tasks.pop(rt.proc.marker, None)

    def tasks(self) -> list[RunningTask]:
        with self._lock:
            return list(self._tasks.values())

    def wake(self) -> None:
        self._wake.put(None)

    def start(self) -> None:
        self._thread = start_thread(self._run, "watchdog")

    def stop(self) -> None:
        self._stop.set()
        self._wake.put(None)
        if self._thread is not None:
            self._thread.join(5.0)

    # -- watchdog thread -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.tick()
            except Exception:  # the one thread that kills must not die of a bug
                log.exception("watchdog tick failed")
                wait = 0.1
            self._next_check = self.clock() + wait
            try:
                self._wake.get(timeout=wait)
                while True:  # one tick answers every wake-up so far
                    self._wake.get_nowait()
            except queue.Empty:
                pass
            self._next_check = math.inf

    def tick(self) -> float:
        """Check every task once; signal what needs it; return seconds until the next check."""
        now = self.clock()
        term: list[RunningTask] = []
        kill: list[RunningTask] = []
        next_check = now + MAX_SLEEP
        for rt in self.tasks():
            if rt.clean.is_set():
                continue
            if rt.exited_at is not None:
                continue  # handled by _cleanup below
            keeper = rt.keeper
            if not rt.lock_loss_handled and (keeper.lock_lost.is_set() or now >= keeper.deadline):
                rt.lock_loss_handled = True
                why = keeper.lost_reason or "lease deadline passed without a successful renewal"
                # Gone already: the lifeline killed it while the supervisor was frozen.  Say
                # so, not "sending": the signal below only reaches leftovers, if any.
                log.error("lock lost (%s): %s", why,
                          f"sending {signal.Signals(self.lock_lost_signal).name} to the task's "
                          "process tree" if self.signaller.group_running(rt.proc.pgid)
                          else "the task's process tree was already gone",
                          extra={"task_id": rt.task_id})
                if self.lock_lost_signal == signal.SIGKILL:
                    if rt.state is not Escalation.KILLED:
                        kill.append(rt)
                    rt.term_reason = rt.term_reason or "lock lost"
                elif rt.state is Escalation.RUNNING:
                    self._terminating(rt, now, "lock lost")
                    term.append(rt)
            if rt.cancel is not None and not rt.cancel_handled:
                self._cancel(rt, rt.cancel, now, term, kill)
            if rt.kill_reason and rt.state is not Escalation.KILLED and rt not in kill:
                kill.append(rt)
            if rt.stop_reason and rt.state is Escalation.RUNNING:
                self._terminating(rt, now, rt.stop_reason)
                term.append(rt)
            if (rt.time_limit_at is not None and now >= rt.time_limit_at
                    and rt.state is Escalation.RUNNING):
                log.warning("task time limit reached: sending SIGTERM",
                            extra={"task_id": rt.task_id})
                self._terminating(rt, now, "time limit")
                term.append(rt)
            if (rt.state is Escalation.TERMINATING and self._escalates(rt)
                    and rt.term_deadline is not None and now >= rt.term_deadline
                    and rt not in kill):
                log.warning("task still running %.1fs after SIGTERM: sending SIGKILL",
                            now - (rt.term_deadline - self._grace(rt)),
                            extra={"task_id": rt.task_id})
                kill.append(rt)
            # Only deadlines not yet acted on: a spent one would make us spin.
            if rt.state is not Escalation.KILLED and rt not in kill:
                pending = [] if rt.lock_loss_handled else [keeper.deadline]
                if rt.state is Escalation.RUNNING and rt.time_limit_at is not None:
                    pending.append(rt.time_limit_at)
                if rt.state is Escalation.TERMINATING and self._escalates(rt) \
                        and rt.term_deadline is not None:
                    pending.append(rt.term_deadline)
                next_check = min([next_check, *pending])
        for rt in kill:
            rt.state = Escalation.KILLED
        if term:
            self.signal_tasks(term, signal.SIGTERM)
        if kill:
            self.signal_tasks(kill, signal.SIGKILL)
        if self._cleanup(now):
            next_check = min(next_check, now + 0.1)
        return max(0.0, next_check - self.clock())

    def _cancel(self, rt: RunningTask, cancel: Cancel, now: float, term: list[RunningTask],
                kill: list[RunningTask]) -> None:
        """Carry out ``rt``'s ``cancel``: SIGTERM now and SIGKILL after its grace, or SIGKILL
        now."""
        rt.cancel_handled = True
        grace = max(0.0, float(cancel.grace))
        if grace == 0:
            if rt.state is not Escalation.KILLED and rt not in kill:
                log.warning("cancelled: sending SIGKILL to the task's process tree",
                            extra={"task_id": rt.task_id})
                kill.append(rt)
            rt.term_reason = rt.term_reason or "cancelled"
        elif rt.state is Escalation.RUNNING:
            log.warning("cancelled: sending SIGTERM to the task's process tree, SIGKILL in "
                        "%gs", grace, extra={"task_id": rt.task_id})
            self._terminating(rt, now, "cancelled")
            rt.term_grace = grace
            rt.term_deadline = now + grace
            term.append(rt)
        elif rt.state is Escalation.TERMINATING:  # already stopping: the sooner SIGKILL wins
            deadline = now + grace
            if rt.term_deadline is None or not self._escalates(rt) \
                    or deadline < rt.term_deadline:
                rt.term_deadline = deadline
                rt.term_grace = grace

    def _terminating(self, rt: RunningTask, now: float, reason: str) -> None:
        rt.state = Escalation.TERMINATING
        rt.term_reason = rt.term_reason or reason
        rt.term_deadline = now + self.kill_timeout
        if rt.stop_kill_timeout is not None and reason == rt.stop_reason:
            rt.term_deadline = now + rt.stop_kill_timeout

    def _grace(self, rt: RunningTask) -> float:
        if rt.term_grace is not None:
            return rt.term_grace
        if rt.stop_kill_timeout is not None and rt.term_reason == rt.stop_reason:
            return rt.stop_kill_timeout
        return self.kill_timeout

    def _escalates(self, rt: RunningTask) -> bool:
        """kill_timeout 0 never escalates; a preemption deadline or a cancel always does."""
        if rt.term_grace is not None:
            return True
        if rt.stop_kill_timeout is not None and rt.term_reason == rt.stop_reason:
            return True
        return self.kill_timeout > 0

    def _shell_pids(self) -> set[int]:
        pids = {rt.proc.pid for rt in self.tasks() if rt.exited_at is None}
        return pids | self._exclude()

    def signal_tasks(self, rts: list[RunningTask], sig: int) -> None:
        """Signal each task's group at once, then every descendant that left it (watchdog
        thread)."""
        for rt in rts:
            if rt.proc.popen.returncode is None or self.signaller.group_alive(rt.proc.pgid):
                self.signaller.signal_group(rt.proc.pgid, sig)
        trees = self.signaller.task_trees([rt.proc for rt in rts], self._shell_pids())
        for rt in rts:
            pids = trees.get(rt.proc.marker, set())
            if pids:
                self.signaller.signal_pids(pids, sig)
        log.debug("sent %s to %d task(s)", signal.Signals(sig).name, len(rts))

    def _cleanup(self, now: float) -> bool:
        """Leftovers of exited shells: SIGTERM, then SIGKILL after a grace.  True while busy."""
        pending = [rt for rt in self.tasks() if rt.exited_at is not None
                   and not rt.clean.is_set()]
        if not pending:
            self.cleanup_busy = False
            return False
        exclude = self._shell_pids()
        # Only an adopted orphan of one of these tasks calls for the (costly) /proc walk; a
        # child that is merely a shell spawned a moment ago carries another task's marker.
        markers = {rt.proc.marker for rt in pending}
        orphans = self.signaller.adopted(markers, exclude)
        trees: dict[str, set[int]] = {}
        if orphans:
            trees = self.signaller.task_trees([rt.proc for rt in pending], exclude)
        busy = False
        for rt in pending:
            pids = trees.get(rt.proc.marker, set())
            group = self.signaller.group_alive(rt.proc.pgid)
            if not pids and not group:
                rt.clean.set()
                self.cleaned_count += 1
                continue
            busy = True
            if rt.cleanup_deadline is None:
                rt.cleanup_deadline = now + LEFTOVER_GRACE
                log.info("shell exited; sending SIGTERM to %d leftover process(es)%s",
                         len(pids), " and its process group" if group else "",
                         extra={"task_id": rt.task_id})
                sig = signal.SIGTERM
            elif now >= rt.cleanup_deadline:
                sig = signal.SIGKILL
            else:
                continue
            if group:
                self.signaller.signal_group(rt.proc.pgid, sig)
            self.signaller.signal_pids(pids, sig)
        self.cleanup_busy = busy
        return busy
