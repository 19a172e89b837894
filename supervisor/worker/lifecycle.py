"""The worker's state and what moves it: stop signals (SIGTERM, SIGINT, SIGHUP, SIGXCPU),
SIGUSR1 drain (or a drain/stop command from the control thread), Azure Scheduled Events,
``--time-limit``, ``--idle-timeout`` and ``--max-consecutive-failures``; and what does not:
SIGUSR2, a reload (worker/reload.py), only while running.

Main thread only.  A transition never signals a task itself: it sets a request on each running
task (``stop_reason``, ``kill_reason``) and wakes the watchdog, the one thread that signals.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import signal
import time
from typing import Callable

from ..core.settings import EXIT_FAILURES, EXIT_OK, Settings
from ..core.signals import (
    DRAIN_SIGNAL,
    RELOAD_SIGNAL,
    STOP_ONCE_SIGNALS,
    STOP_SIGNALS,
    on_other_signal,
)
from ..core.signals import name as signal_name
from .events import Event, PreemptEvent, ScheduledEventChanged
from .keeper import LeaseKeeper
from .notify import Notifier
from .preemption import (
    ScheduledEventsPoller,
    imds_base,
    local_vm_names,
    scheduled_events_enabled,
)
from .watchdog import RunningTask, Watchdog

log = logging.getLogger("jobq.worker")

PREEMPT_MARGIN = 5.0  # a preempted task is SIGKILLed this long before the event's NotBefore


class State(enum.Enum):
    RUNNING = "running"
    PREEMPTING = "preempting"  # Scheduled Events Preempt: tasks requeued; resumes if cancelled
    DRAINING = "draining"  # SIGUSR1: no new tasks, running ones finish
    STOPPING = "stopping"  # SIGTERM/SIGINT/preemption: running ones are requeued


class Lifecycle:
    """State, stop reason and exit code of one worker run (main thread only).

    The methods that act on tasks take the worker's list of tasks not yet settled
    (``active``); the Scheduled Events poller reports on ``events``, the main loop's queue
    (as a ``ScheduledEventChanged``)."""

    def __init__(self, settings: Settings, notifier: Notifier, watchdog: Watchdog,
                 events: queue.SimpleQueue[Event],
                 clock: Callable[[], float] = time.monotonic,
                 reload: Callable[[], None] | None = None) -> None:
        self.s = settings
        self.reload = reload  # SIGUSR2 while running (worker/reload.py's Reloader.reload)
        self.started_at = clock()
        self.notifier = notifier
        self.watchdog = watchdog
        self.events = events
        self.state = State.RUNNING
        self.exit_code = EXIT_OK
        self.stop_reason = ""
        self.stop_signals = 0
        self.poller: ScheduledEventsPoller | None = None
        self.preempt_event: PreemptEvent | None = None
        self.preempt_acked = False

    def start_poller(self) -> None:
        if not scheduled_events_enabled(self.s.scheduled_events, os.environ):
            return
        url = self.s.scheduled_events_url
        self.poller = ScheduledEventsPoller(
            url, interval=self.s.scheduled_events_interval,
            on_change=lambda ev: self.events.put(ScheduledEventChanged(ev)),
            vm_names=local_vm_names(imds_base(url)))
        self.poller.start()
        log.info("watching Azure Scheduled Events at %s", url)

    def stop_poller(self) -> None:
        if self.poller is not None:
            self.poller.stop()

    def on_signal(self, signum: int, active: list[RunningTask],
                  inherited_ignored: bool = False) -> None:
        """A signal to the supervisor, drained from the signal queue (main thread); what each
        does: core/signals.py.  ``inherited_ignored``: the worker was started with it ignored."""
        if signum == RELOAD_SIGNAL and not inherited_ignored and self.reload is not None:
            if self.state is State.RUNNING:
                self.reload()
            else:  # the unit is on its way down (or the VM is): nothing to reload into
                log.warning("SIGUSR2 received: reload ignored while %s", self.state.value)
        elif inherited_ignored or signum not in (*STOP_SIGNALS, *STOP_ONCE_SIGNALS,
                                                 DRAIN_SIGNAL, signal.SIGCHLD):
            on_other_signal(signum, inherited_ignored, log)
        elif signum in STOP_ONCE_SIGNALS:  # not counted: a SIGTERM after it is no "second"
            if self.state is not State.STOPPING:
                self.begin_stop(f"{signal_name(signum)} received", EXIT_OK, active)
        elif signum in STOP_SIGNALS:
            self.stop_signals += 1
            name = signal_name(signum)
            if self.stop_signals == 1:
                self.begin_stop(f"{name} received", EXIT_OK, active)
            else:
                log.warning("%s received again: killing every task now", name)
                for rt in active:
                    rt.kill_reason = f"second {name}"
                self.watchdog.wake()
        elif signum == DRAIN_SIGNAL:
            self.drain("drained (SIGUSR1)", "SIGUSR1", active)

    def drain(self, reason: str, by: str, active: list[RunningTask]) -> None:
        """No new tasks; running ones finish; then exit 0 (main thread).  From SIGUSR1 or a
        drain command (control thread, via the main loop's queue)."""
        if self.state is State.RUNNING:
            self.state = State.DRAINING
            self.stop_reason = reason
            self.notifier.stopping()
            log.warning("%s: draining -- no new tasks; %d running task(s) may finish", by,
                        len(active))

    def on_command(self, action: str, who: str, active: list[RunningTask]) -> None:
        """A drain or stop command for this worker, from the control thread (main thread)."""
        if action == "drain":
            self.drain(f"drained by {who} (jobq-ctl drain)", "drain command", active)
        else:
            self.begin_stop(f"stopped by {who} (jobq-ctl stop)", EXIT_OK, active)

    def on_scheduled_event(self, event: PreemptEvent | None,
                           active: list[RunningTask]) -> bool:
        """A Preempt/Terminate appeared (or changed), or it was cancelled (main thread).

        True when a cancelled event lets the worker receive again."""
        if self.state in (State.STOPPING, State.DRAINING):
            return False
        if event is None:
            if self.state is State.PREEMPTING:
                log.warning("Scheduled Events: the event was cancelled; receiving again")
                self.state = State.RUNNING
                self.preempt_event = None
                return True
            return False
        self.state = State.PREEMPTING
        self.preempt_event = event
        self.preempt_acked = False
        left = event.seconds_left(time.time())
        wait = self.s.kill_timeout if self.s.kill_timeout > 0 else float("inf")
        if left is not None:
            wait = min(wait, max(0.0, left - PREEMPT_MARGIN))
        log.warning("Scheduled Events: %s %s (NotBefore in %s): no new tasks; %d running "
                    "task(s) get SIGTERM, SIGKILL after %s, and go back to the queue",
                    event.event_type, event.event_id,
                    "?" if left is None else f"{left:.0f}s", len(active),
                    "never" if wait == float("inf") else f"{wait:.0f}s")
        for rt in active:
            if rt.stop_reason is None and rt.exited_at is None:  # exited: settled as it ended
                rt.stop_reason = "preempted"
                rt.stop_kill_timeout = None if wait == float("inf") else wait
        self.watchdog.wake()
        return False

    def begin_stop(self, reason: str, exit_code: int, active: list[RunningTask],
                   level: int = logging.WARNING) -> None:
        """Stop receiving; SIGTERM every task; requeue them as they exit (main thread).

        Also from DRAINING: a stop signal while draining still requeues what runs.  ``level``:
        a stop the operator asked for by option (idle timeout, time limit) is no warning."""
        if self.state is State.STOPPING:
            return
        self.state = State.STOPPING
        self.stop_reason = reason
        self.exit_code = exit_code
        self.notifier.stopping()
        # A task whose shell already exited is being settled, not stopped.
        log.log(level, "stopping (%s): %d running task(s) get SIGTERM and go back to the queue",
                reason, sum(1 for rt in active if rt.exited_at is None))
        for rt in active:
            if rt.exited_at is None:  # an exited one settles by its exit status: no rerun
                rt.stop_reason = rt.stop_reason or "preempted"
        self.watchdog.wake()

    def check_limits(self, now: float, idle_since: float, active: list[RunningTask]) -> None:
        """Stop at ``--time-limit`` or after ``--idle-timeout`` without tasks (main thread)."""
        if self.s.time_limit is not None and now >= self.started_at + self.s.time_limit:
            self.begin_stop("worker time limit reached", EXIT_OK, active, logging.INFO)
        elif (self.s.idle_timeout is not None and not active
              and now - idle_since >= self.s.idle_timeout):
            self.begin_stop("idle timeout", EXIT_OK, active, logging.INFO)

    def failure_streak(self, failures: int, active: list[RunningTask]) -> None:
        """``failures`` tasks failed in a row, reaching the limit (main thread)."""
        if self.state is State.RUNNING:
            log.error("%d tasks failed in a row: stopping (--max-consecutive-failures)",
                      failures)
            self.begin_stop("too many consecutive failures", EXIT_FAILURES, active)

    def acknowledge_preempt(self, active: list[RunningTask], settling: list[LeaseKeeper]) -> None:
        """Once every task is back on the queue, tell Azure it may go ahead (main thread)."""
        if (self.state is State.PREEMPTING and not active and not settling
                and self.s.scheduled_events_ack and not self.preempt_acked
                and self.poller is not None and self.preempt_event is not None):
            self.preempt_acked = self.poller.acknowledge(self.preempt_event.event_id)
