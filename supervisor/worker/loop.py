"""The main loop: poll, dispatch, settle, shut down.

Main thread only.  It installs the signal handlers first, then blocks on one SimpleQueue of
``events.Event``: signal numbers (from the handlers), spawn jobs back from the spawner,
Scheduled Events changes, the control thread's pause flag and drain/stop commands
(fleet/agent.py), and plain wake-ups (a task's output closed), with a timeout no longer
than the next thing it has to do.  A lost lock is not on it: the keeper wakes the watchdog,
which kills the task, and the main loop reaps it on the SIGCHLD.  It never signals a task
itself: it sets a request on the task and wakes the watchdog.

The parts it drives live beside it: worker/launch.py (lease -> running task), worker/settlement.py
(what
happens to a lease once its task is over), worker/lifecycle.py
(running/preempting/draining/stopping),
worker/reporting.py (systemd, metrics file, summary), worker/reload.py (SIGUSR2).
"""

from __future__ import annotations

import logging
import math
import queue
import secrets
import time
from typing import TYPE_CHECKING, Callable, Union

from ..backends.base import Backend, BackendConfigError, BackendError
from ..core.settings import EXIT_TASKS_FAILED, Settings
from .events import WAKE, ControlRequest, Event, ScheduledEventChanged, TaskStart
from .keeper import LeaseKeeper
from .launch import Launcher
from .lifecycle import Lifecycle, State
from .lifeline import Lifeline
from .metrics import Metrics
from .notify import Notifier
from .output_pump import OutputPump
from .pacing import ReceivePacing
from .preemption import SignalQueue
from .process import set_child_subreaper
from .reaping import Reaper, ready_to_settle
from .reload import Reloader
from .reporting import Reporter
from .settlement import Settlement
from .spawner import SpawnJob
from .task_guard import TaskGuard
from .watchdog import RunningTask, Watchdog

if TYPE_CHECKING:
    from ..core.outcome_counts import OutcomeCounts
    from ..fleet.agent import ControlAgent
    from ..fleet.agent_group import AgentGroup

log = logging.getLogger("jobq.worker")

LIFELINE_FLUSH_EVERY = 0.2
CHANGE_PROBE_EVERY = 0.1


class Worker:
    def __init__(self, settings: Settings, backend: Backend,
                 clock: Callable[[], float] = time.monotonic,
                 guard: TaskGuard | None = None, signals: SignalQueue | None = None,
                 reread: Callable[[str], Settings] | None = None) -> None:
        self.s = settings
        # signature/allow-list checks, task user, resource limits (worker/task_guard.py)
        self.guard = guard if guard is not None else TaskGuard.from_settings(settings)
        self.backend = backend
        self.clock = clock
        # ``signals``: installed before the backend was opened (worker/main.py), with what arrived
        # since still on its queue, which becomes the main loop's
        self.signals = signals if signals is not None else SignalQueue(queue.SimpleQueue())
        self.events: queue.SimpleQueue[Event] = self.signals.events
        self.token = secrets.token_hex(8)
        self.active: list[RunningTask] = []  # spawned, not yet settled
        self.cleaning: list[RunningTask] = []  # settled, leftovers being cleaned
        self.cleaned_seen = 0  # the watchdog's cleaned_count when ``cleaning`` was last scanned
        self.lifeline: Lifeline | None = None
        self.output_pump = OutputPump.for_worker(settings)  # and the output-store thread
        self.next_lifeline_flush = clock()
        # A cheap "anything new?" probe lets an idle worker start pushed work at once; a
        # backend that hears of news on a thread of its own (PostgreSQL's LISTEN) also ends
        # the wait then, instead of at the next probe.
        self.change_probe = backend.change_probe
        if self.change_probe:
            backend.wake_with(lambda: self.events.put(WAKE))
        self.watchdog = Watchdog(kill_timeout=settings.kill_timeout,
                                 lock_lost_behavior=settings.lock_lost_behavior, clock=clock,
                                 exclude_pids=self._helper_pids)
        self.notifier = Notifier()
        # ``reread``: the start's command line parsed again, for a reload (worker/main.py)
        self.reloader = Reloader(settings, reread, self.notifier, lambda: self.ready_sent)
        self.lifecycle = Lifecycle(settings, self.notifier, self.watchdog, self.events, clock,
                                   reload=self.reloader.reload)
        self.idle_since = clock()
        self.next_receive = clock()
        self.pacing = ReceivePacing(settings.poll_interval, self.clock)  # back-off; hold when dry
        self.last_empty_receive: float | None = None
        self.reaper = Reaper(self.watchdog, self._helper_pids, clock())
        self.metrics = Metrics(settings.metrics_file, backend=settings.backend,
                               queue=settings.queue, serve=settings.metrics_port is not None)
        self.ready_sent = False
        self.settlement = Settlement(
            settings, backend, self.guard, self.metrics,
            on_failure_streak=lambda n: self.lifecycle.failure_streak(n, self.active),
            wake=lambda: self.events.put(WAKE))
        self.launcher = Launcher(settings, self.guard, self.settlement, self.metrics,
                                 self.watchdog, self.output_pump, self.events, self.token, clock)
        self.reporter = Reporter(settings, self.notifier, self.metrics, self.settlement.counts,
                                 clock)
        self.paused = False  # the queue's pause flag, as the control thread last saw it
        self.agent: Union[ControlAgent, AgentGroup, None] = None
        if settings.control != "off":  # its modules (~10 ms to import) only when it may be on
            from ..fleet.agent_group import AgentGroup

            self.agent = AgentGroup.for_worker(
                settings, lambda paused: self.events.put(ControlRequest(paused=paused)),
                lambda command: self.events.put(ControlRequest(command=command)),
                self.watchdog.wake, self._control_view, self.guard.keys, backend)
        if self.agent is not None:  # claim-time cancels: a dict lookup; results: queued
            self.launcher.cancels, self.settlement.results.sink = (self.agent.cancels,
                                                                   self.agent.result)

    @property
    def state(self) -> State:
        return self.lifecycle.state

    @property
    def settling(self) -> list[LeaseKeeper]:
        """Keepers whose settlement runs on their thread (``Settlement.settling``)."""
        return self.settlement.settling

    # ------------------------------------------------------------------------------ run
    def run(self) -> int:
        self.signals.install()
        life, done = self.lifecycle, False  # done: a stop, not an exception; summary due
        try:
            set_child_subreaper()
            self.lifeline = self.launcher.lifeline = Lifeline(
                self.token, self.s.lock_lost_behavior, self.s.kill_timeout, self.s.log_format)
            # our leases outlive us until the lifeline has killed what we ran
            self.backend.add_lease_holder(self.lifeline.pid)
            self.watchdog.start()
            self.output_pump.start()
            self.launcher.start()
            self.lifecycle.start_poller()
            self.reporter.start()  # the queue sampler and the metrics' HTTP server
            if self.agent is not None:
                self.agent.start()
                self.agent.wait_first_poll()  # live cancels and the pause flag, 2 s at most
            log.info("worker %s started: backend=%s queue=%s slots=%d lock=%gs renew=%gs "
                     "output=%s", self.s.worker_id, self.s.backend, self.s.queue,
                     self.s.num_workers, self.s.lock, self.s.renew_every,
                     self.output_pump.describe())
            log.info("%s", self.guard.limits.describe())
            while not self._finished():
                self._wait_and_drain()
                self._turn()
            self.notifier.stopping()
            self.metrics.set_running(0)
            self.metrics.write()
            c = self.settlement.counts
            batch_end = life.stop_reason in ("queue empty", "idle timeout")
            if batch_end and c["failed"] + c["dead_lettered"]:
                life.exit_code = EXIT_TASKS_FAILED
            done = True
            return life.exit_code
        finally:
            self._teardown(clean=done)
            self.signals.restore()
            if done:  # after the teardown's cleanup and output: the summary is the last line
                self.reporter.summary(self.clock() - life.started_at, life.stop_reason,
                                      life.exit_code)

    def _helper_pids(self) -> set[int]:
        return {self.lifeline.pid} if self.lifeline is not None else set()

    def _control_view(self) -> tuple[str, tuple[RunningTask, ...], int, OutcomeCounts]:
        """State, snapshots (copies) of the tasks and the outcome counts, slots: the worker
        record (control thread)."""
        state = self.state.value if self.state is not State.PREEMPTING else "stopping"
        return state, tuple(self.active), self.s.num_workers, self.settlement.snapshot()

    def _teardown(self, clean: bool) -> None:
        self.launcher.stop()
        self.launcher.release_ready()
        for job in list(self.launcher.starting):  # forked by now: register them so they are killed
            if job.done.is_set():
                self._spawned(job)
        for rt in self.active + self.cleaning:
            rt.kill_reason = rt.kill_reason or "supervisor exiting"
        if self.active or self.cleaning:
            self.watchdog.wake()
            deadline = self.clock() + 5.0
            while (self.active or self.cleaning) and self.clock() < deadline:
                self._reap(self.clock())
                self._settle_exited(self.clock())
                self.cleaning = [rt for rt in self.cleaning if not rt.clean.is_set()]
                self._wait(0.05)
        budget = self.clock() + 30.0
        for keeper in list(self.settling):
            if self.settlement.batch_complete:  # the completer may hand one back to its thread
                self.settlement.settle_by(keeper, max(0.0, budget - self.clock()))
            keeper.join(max(0.0, budget - self.clock()))
        self.settlement.completer.stop()
        self.watchdog.stop()
        self.output_pump.stop()
        self.lifecycle.stop_poller()
        self.reporter.stop()
        if self.agent is not None:  # after the settlements: their results go out first
            self.agent.stop(clean)
        if self.lifeline is not None:
            self.lifeline.close()

    def _wait(self, timeout: float) -> list[Event]:
        items: list[Event] = []
        try:
            items.append(self.events.get(timeout=max(0.0, timeout)))
            while True:
                items.append(self.events.get_nowait())
        except queue.Empty:
            pass
        return items

    def _wait_and_drain(self) -> None:
        for item in self._wait(self._next_wakeup()):
            if isinstance(item, int):
                self.lifecycle.on_signal(item, self.active,
                                         item in self.signals.inherited_ignored)
            elif isinstance(item, SpawnJob):
                self._spawned(item)
            elif isinstance(item, ControlRequest):
                self._control(item)
            elif isinstance(item, ScheduledEventChanged):
                if self.lifecycle.on_scheduled_event(item.event, self.active):
                    self.next_receive = self.clock()
            # a Wake only ends the wait: this turn looks at everything anyway

    def _control(self, req: ControlRequest) -> None:
        """Pause/resume, or a drain/stop command for this worker (main thread)."""
        if req.paused is not None:
            self.paused = req.paused
            self.next_receive = self.clock()
        if req.command is not None and self.agent is not None:
            self.lifecycle.on_command(req.command.action, req.command.who, self.active)
            self.agent.acted(req.command)

    def _next_wakeup(self) -> float:
        now = self.clock()
        t = now + self.s.poll_interval
        if (self.state is State.RUNNING and not self.paused
                and self._running() + len(self.launcher.starting) < self.s.num_workers
                and not self.settlement.backlogged(self.active)):
            if not self._receive_held(now):  # else: a spawn job, an exit or a settle poll
                t = min(t, max(self.next_receive, self.pacing.gather_until or -math.inf))
            if self.launcher.ready:
                t = now
            if self.change_probe:
                t = min(t, now + CHANGE_PROBE_EVERY)
        for rt in self.active:
            if rt.exited_at is not None:
                t = min(t, now + 0.05)
        if self.cleaning or self.settling:
            t = min(t, now + 0.1)
        t = min(t, self.launcher.next_keeper_start, self.launcher.next_ready_due())
        if self.s.time_limit is not None:
            t = min(t, self.lifecycle.started_at + self.s.time_limit)
        t = min(t, self.reporter.next_due())
        return max(0.0, t - now)

    # ---------------------------------------------------------------------------- turn
    def _turn(self) -> None:
        now = self.clock()
        self.launcher.start_keepers(now, self.active)
        self._reap(now)
        if self.state in (State.RUNNING, State.PREEMPTING):
            self.lifecycle.check_limits(now, self.idle_since, self.active)
        if self.state is State.RUNNING:
            try:
                self.backend.maintenance()
            except BackendConfigError:
                raise
            except BackendError as exc:
                self.metrics.backend_error("maintenance")
                log.warning("backend maintenance failed: %s", exc)
            # A slot is free once its shell exited: the next task starts before this turn
            # spends time settling the last one.
            if self.paused:  # running tasks go on; held leases go back uncounted
                self.launcher.release_ready()
            else:
                self._receive(now)
        else:  # stopping, draining or preempted: none of them starts
            self.launcher.release_ready()
            self.launcher.cancel_starting()
        self._settle_exited(now)
        self.settlement.prune()
        if self.watchdog.cleaned_count != self.cleaned_seen:  # scan only when it changed
            self.cleaned_seen = self.watchdog.cleaned_count
            still = []
            for rt in self.cleaning:
                if rt.clean.is_set():
                    self._forget(rt)
                else:
                    still.append(rt)
            self.cleaning = still
        self.lifecycle.acknowledge_preempt(self.active, self.settling)
        self._report(self.clock())
        now = self.clock()
        if self.lifeline is not None and now >= self.next_lifeline_flush:
            # At most a few writes a second: every write wakes the helper, and a task not yet
            # sent is still found by its environment marker if we die in between.
            self.lifeline.flush()
            self.next_lifeline_flush = now + LIFELINE_FLUSH_EVERY
        self.output_pump.flush()

    def _report(self, now: float) -> None:
        """systemd status/watchdog and the metrics file (main thread)."""
        self.reporter.report(now, self.state.value, self.active, self.settling)

    def _finished(self) -> bool:
        if self.state in (State.STOPPING, State.DRAINING):
            return (not self.active and not self.settling and not self.launcher.starting
                    and not self.launcher.ready)
        if self.state is State.PREEMPTING:
            return False  # the VM goes away, or the event is cancelled and we go on
        if self.s.exit_when_empty and self._empty():
            self.lifecycle.stop_reason = "queue empty"
            return True
        return False

    def _empty(self) -> bool:
        if (self.active or self.launcher.starting or self.settling or self.launcher.ready
                or self.last_empty_receive is None):
            return False
        # and a dead worker's task is not on its way back (SQLite: docs/backends.rst)
        return (self.settlement.all_back_by(self.last_empty_receive)
                and not self.backend.leases_coming_back())

    # ------------------------------------------------------------------------- receive
    def _receive_held(self, now: float) -> bool:
        # ``settling``, not Settlement.pending: a keeper done but not pruned yet still keeps
        # _empty false, and a receive made then was one more 1 s wait at a drain's end.
        return self.pacing.holds(now, bool(self.launcher.starting or self.settling or any(
            rt.exited_at is not None for rt in self.active)))

    def _busy_ends(self, now: float) -> list[float]:
        """When each busy slot's task is expected to end, from the recent tasks' run time
        (empty while none has ended) (main thread)."""
        d = self.launcher.recent_duration
        if d is None:
            return []
        return [*(rt.started + d for rt in self.active if rt.exited_at is None),
                *([now + d] * len(self.launcher.starting))]

    def _running(self) -> int:
        """Tasks whose shell has not exited: an exited one no longer takes a slot."""
        return sum(1 for rt in self.active if rt.exited_at is None)

    def _receive(self, now: float) -> None:
        self.launcher.expire_ready(now)
        free = self.s.num_workers - self._running() - len(self.launcher.starting)
        if free <= 0 or self.settlement.holds_starts(self.active):
            return  # a failure streak may stop the worker, or settlements are at their bound
        free -= self.launcher.take_ready(free)  # leases received ahead go first
        if free <= 0:
            return
        if self._receive_held(now):
            return
        if now < self.next_receive and not (
                self.change_probe and self.pacing.backoff == 0
                and self.backend.changed()):
            return
        if not self.backend.receive_ahead and self.pacing.gather(now, self._busy_ends(now)):
            return  # short tasks about to end: one receive fills their slots too
        t_sent = self.clock()
        want = free + self.launcher.ahead(free)
        try:
            leases = self.backend.receive(want, self.s.lock)
        except BackendConfigError:
            raise
        except Exception as exc:  # BackendError; or a client library's bug (the Storage
            # Queue SDK has raised RuntimeError from a race in its model cache): retried too
            self.metrics.backend_error("receive")
            self.next_receive = self.clock() + self.pacing.failed(exc)
            return
        self.pacing.worked()
        self.metrics.receive_ok()
        if not self.ready_sent:
            self.notifier.ready()
            self.ready_sent = True
            # once ready, not before: a run stopped by a config error stays one line
            self.guard.log_warnings()
        if len(leases) < free:  # a slot left empty, not just fewer held: wait a poll
            self.next_receive = t_sent + self.s.poll_interval
            self.pacing.ran_dry(self.clock())
            if not leases:
                self.last_empty_receive = t_sent
        else:
            self.pacing.filled(self.clock() - t_sent)
        for lease in leases[:free]:
            self.launcher.dispatch(lease, t_sent)
        self.launcher.hold(leases[free:], t_sent)
        self.launcher.expire_ready(self.clock())

    def _spawned(self, job: SpawnJob[TaskStart]) -> None:
        """A spawner thread is done with ``job``: register the task (main thread)."""
        rt = self.launcher.spawned(job)
        if rt is None:
            return
        self.active.append(rt)
        if self.state in (State.STOPPING, State.PREEMPTING):
            rt.stop_reason = "preempted"
        self.watchdog.add(rt)

    # ------------------------------------------------------------------------ settling
    def _reap(self, now: float) -> None:
        if (self.reaper.reap(now, self.active, bool(self.launcher.starting))
                and self.state is State.RUNNING):
            self.next_receive = min(self.next_receive, now)

    def _settle_exited(self, now: float) -> None:
        still = []
        for rt in self.active:
            if rt.exited_at is None or not ready_to_settle(rt, now, self.state is State.RUNNING):
                still.append(rt)
                continue
            self.settlement.conclude(rt, now, stopping=self.state is State.STOPPING)
            self.launcher.note_duration(rt.exited_at - rt.started)
            if rt.clean.is_set():  # the watchdog found its tree gone before this turn
                self._forget(rt)
            else:
                self.cleaning.append(rt)
            self.idle_since = now
        self.active = still
        self.settlement.flush()  # the tasks that succeeded now, completed together

    def _forget(self, rt: RunningTask) -> None:
        self.watchdog.remove(rt)
        if self.lifeline is not None:
            self.lifeline.unregister(rt.proc.pgid)
