"""The main loop: poll, dispatch, settle, shut down.

Main thread only.  It installs the signal handlers first, then blocks on one SimpleQueue that
carries signal numbers (from the handlers) and wake-ups (task output closed, lock lost), with a
timeout no longer than the next thing it has to do.  It never signals a task itself: it sets a
request on the task and wakes the watchdog.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import queue
import re
import secrets
import signal
import time
from typing import Any, Callable

from .backends.base import Backend, BackendConfigError, BackendError, Lease
from .lease import LeaseKeeper
from .lifeline import Lifeline
from .metrics import Metrics
from .notify import Notifier
from .output import OutputPump, TaskOutput
from .preemption import (
    STOP_SIGNALS,
    PreemptEvent,
    ScheduledEventsPoller,
    SignalQueue,
    imds_base,
    local_vm_names,
    scheduled_events_enabled,
)
from .process import (
    child_exited,
    describe_exit,
    reap_orphans,
    set_child_subreaper,
    task_environment,
)
from .security import TaskGuard
from .settings import EXIT_FAILURES, EXIT_OK, EXIT_TASKS_FAILED, Settings
from .spawner import Spawner, SpawnJob
from .watchdog import RunningTask, Watchdog

log = logging.getLogger("jobq.worker")
task_log = logging.getLogger("jobq.task")

OUTPUT_GRACE = 1.0  # after the shell exits, wait this long at most for the output to close
EXTERNAL_SIGTERM_GRACE = 1.0  # a task killed by SIGTERM from outside: is a stop coming?
ORPHAN_REAP_EVERY = 5.0
ORPHAN_REAP_BUSY = 0.2
SPAWN_THREADS = 2
LIFELINE_FLUSH_EVERY = 0.2
CHANGE_PROBE_EVERY = 0.1
BACKEND_RETRY_MAX = 10.0
PREEMPT_MARGIN = 5.0  # a preempted task is SIGKILLed this long before the event's NotBefore
STATUS_EVERY = 1.0
KEEPER_START_AHEAD = 1.0


class State(enum.Enum):
    RUNNING = "running"
    PREEMPTING = "preempting"  # Scheduled Events Preempt: tasks requeued; resumes if cancelled
    DRAINING = "draining"  # SIGUSR1: no new tasks, running ones finish
    STOPPING = "stopping"  # SIGTERM/SIGINT/preemption: running ones are requeued


class Worker:
    def __init__(self, settings: Settings, backend: Backend,
                 clock: Callable[[], float] = time.monotonic,
                 guard: TaskGuard | None = None) -> None:
        self.s = settings
        # signature/allow-list checks, task user, resource limits (security.py)
        self.guard = guard if guard is not None else TaskGuard.from_settings(settings)
        self.backend = backend
        self.clock = clock
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.signals = SignalQueue(self.events)
        self.state = State.RUNNING
        self.exit_code = EXIT_OK
        self.stop_reason = ""
        self.token = secrets.token_hex(8)
        self._seq = 0
        self.active: list[RunningTask] = []  # spawned, not yet settled
        self.cleaning: list[RunningTask] = []  # settled, leftovers being cleaned
        self.cleaned_seen = 0  # the watchdog's cleaned_count when ``cleaning`` was last scanned
        self.next_keeper_start = math.inf  # the earliest start_by of a keeper not started
        self.settling: list[LeaseKeeper] = []  # settlement running on the keeper thread
        # released task id -> (keeper doing the release, delay) or when a lost lease is back
        self.awaiting_return: dict[str, tuple[LeaseKeeper, float] | float] = {}
        self.lifeline: Lifeline | None = None
        self.output_pump = OutputPump()
        self.spawner = Spawner(SPAWN_THREADS, on_done=lambda job: self.events.put(job))
        self.starting: list[SpawnJob] = []  # submitted to the spawner, not yet back
        self.next_lifeline_flush = clock()
        # A cheap "anything new?" probe lets an idle worker start pushed work at once.
        self.change_probe: Callable[[], bool] | None = getattr(backend, "changed", None)
        # The inherited environment minus secrets, computed once: os.environ does not change.
        self.base_env = task_environment(dict(os.environ), {"PYTHONUNBUFFERED": "1"})
        self.watchdog = Watchdog(kill_timeout=settings.kill_timeout,
                                 lock_lost_behavior=settings.lock_lost_behavior, clock=clock,
                                 exclude_pids=self._helper_pids)
        self.consecutive_failures = 0
        self.counts = {"succeeded": 0, "failed": 0, "retried": 0, "requeued": 0,
                       "lock_lost": 0, "dead_lettered": 0}
        self.started_at = clock()
        self.idle_since = clock()
        self.next_receive = clock()
        self.receive_backoff = 0.0
        self.last_empty_receive: float | None = None
        self.next_orphan_reap = clock() + ORPHAN_REAP_EVERY
        self.stop_signals = 0
        self.metrics = Metrics(settings.metrics_file, backend=settings.backend,
                               queue=settings.queue)
        self.next_metrics = clock()
        self.notifier = Notifier()
        self.ready_sent = False
        wd = self.notifier.watchdog_interval()
        self.watchdog_ping = wd / 2 if wd else None
        self.next_ping = clock()
        self.last_status = ""
        self.next_status = clock()
        self.stalled_logged = False
        self.poller: ScheduledEventsPoller | None = None
        self.preempt_event: PreemptEvent | None = None
        self.preempt_acked = False

    # ------------------------------------------------------------------------------ run
    def run(self) -> int:
        self.signals.install()
        try:
            set_child_subreaper()
            self.lifeline = Lifeline(self.token)
            self.watchdog.start()
            self.output_pump.start()
            self.spawner.start()
            self._start_poller()
            log.info("worker %s started: backend=%s queue=%s slots=%d lock=%gs renew=%gs",
                     self.s.worker_id, self.s.backend, self.s.queue, self.s.num_workers,
                     self.s.lock, self.s.renew_every)
            log.info("%s", self.guard.limits.describe())
            while not self._finished():
                self._wait_and_drain()
                self._turn()
            self.notifier.stopping()
            self.metrics.set_running(0)
            self.metrics.write()
            batch_end = self.stop_reason in ("queue empty", "idle timeout")
            if batch_end and self.counts["failed"] + self.counts["dead_lettered"]:
                self.exit_code = EXIT_TASKS_FAILED
            c = self.counts
            log.info("summary: succeeded=%d failed=%d dead_lettered=%d retried=%d requeued=%d "
                     "lock_lost=%d duration=%.1fs stop=%r exit=%d", c["succeeded"], c["failed"],
                     c["dead_lettered"], c["retried"], c["requeued"], c["lock_lost"],
                     self.clock() - self.started_at, self.stop_reason or "done", self.exit_code)
            return self.exit_code
        finally:
            self._teardown()
            self.signals.restore()

    def _start_poller(self) -> None:
        if not scheduled_events_enabled(self.s.scheduled_events, os.environ):
            return
        url = self.s.scheduled_events_url
        self.poller = ScheduledEventsPoller(
            url, interval=self.s.scheduled_events_interval,
            on_change=lambda ev: self.events.put(("scheduled-event", ev)),
            vm_names=local_vm_names(imds_base(url)))
        self.poller.start()
        log.info("watching Azure Scheduled Events at %s", url)

    def _helper_pids(self) -> set[int]:
        return {self.lifeline.pid} if self.lifeline is not None else set()

    def _teardown(self) -> None:
        self.spawner.stop()
        for job in list(self.starting):  # forked by now: register them so they are killed
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
        for keeper in self.settling:
            keeper.join(max(0.0, budget - self.clock()))
        self.watchdog.stop()
        self.output_pump.stop()
        if self.poller is not None:
            self.poller.stop()
        if self.lifeline is not None:
            self.lifeline.close()

    def _wait(self, timeout: float) -> list[Any]:
        items = []
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
                self._on_signal(item)
            elif isinstance(item, SpawnJob):
                self._spawned(item)
            elif isinstance(item, tuple) and item[0] == "scheduled-event":
                self._on_scheduled_event(item[1])

    def _next_wakeup(self) -> float:
        now = self.clock()
        t = now + self.s.poll_interval
        if (self.state is State.RUNNING
                and self._running() + len(self.starting) < self.s.num_workers):
            t = min(t, self.next_receive)
            if self.change_probe is not None:
                t = min(t, now + CHANGE_PROBE_EVERY)
        for rt in self.active:
            if rt.exited_at is not None:
                t = min(t, now + 0.05)
        if self.cleaning or self.settling:
            t = min(t, now + 0.1)
        t = min(t, self.next_keeper_start)
        if self.s.time_limit is not None:
            t = min(t, self.started_at + self.s.time_limit)
        if self.watchdog_ping is not None:
            t = min(t, self.next_ping)
        if self.metrics.enabled:
            t = min(t, self.next_metrics)
        return max(0.0, t - now)

    # ------------------------------------------------------------------------- signals
    def _on_signal(self, signum: int) -> None:
        if signum in STOP_SIGNALS:
            self.stop_signals += 1
            name = signal.Signals(signum).name
            if self.stop_signals == 1:
                self.begin_stop(f"{name} received", EXIT_OK)
            else:
                log.warning("%s received again: killing every task now", name)
                for rt in self.active:
                    rt.kill_reason = f"second {name}"
                self.watchdog.wake()
        elif signum == signal.SIGUSR1 and self.state is State.RUNNING:
            self.state = State.DRAINING
            self.stop_reason = "drained (SIGUSR1)"
            self.notifier.stopping()
            log.warning("SIGUSR1: draining -- no new tasks; %d running task(s) may finish",
                        len(self.active))

    def _on_scheduled_event(self, event: PreemptEvent | None) -> None:
        """A Preempt/Terminate appeared (or changed), or it was cancelled (main thread)."""
        if self.state in (State.STOPPING, State.DRAINING):
            return
        if event is None:
            if self.state is State.PREEMPTING:
                log.warning("Scheduled Events: the event was cancelled; receiving again")
                self.state = State.RUNNING
                self.preempt_event = None
                self.next_receive = self.clock()
            return
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
                    "?" if left is None else f"{left:.0f}s", len(self.active),
                    "never" if wait == float("inf") else f"{wait:.0f}s")
        for rt in self.active:
            if rt.stop_reason is None:
                rt.stop_reason = "preempted"
                rt.stop_kill_timeout = None if wait == float("inf") else wait
        self.watchdog.wake()

    def begin_stop(self, reason: str, exit_code: int) -> None:
        """Stop receiving; SIGTERM every task; requeue them as they exit (main thread).

        Also from DRAINING: a stop signal while draining still requeues what runs."""
        if self.state is State.STOPPING:
            return
        self.state = State.STOPPING
        self.stop_reason = reason
        self.exit_code = exit_code
        self.notifier.stopping()
        log.warning("stopping (%s): %d running task(s) get SIGTERM and go back to the queue",
                    reason, len(self.active))
        for rt in self.active:
            rt.stop_reason = rt.stop_reason or "preempted"
        self.watchdog.wake()

    # ---------------------------------------------------------------------------- turn
    def _turn(self) -> None:
        now = self.clock()
        self._start_keepers(now)
        self._reap(now)
        if self.state in (State.RUNNING, State.PREEMPTING):
            self._check_limits(now)
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
            self._receive(now)
        self._settle_exited(now)
        # A keeper whose lease deadline passed will not settle (and may be stuck in a hung
        # call): its message comes back through the broker, so nobody waits for it.
        self.settling = [k for k in self.settling if not k.done.is_set() and not k.lost()]
        if self.watchdog.cleaned_count != self.cleaned_seen:  # scan only when it changed
            self.cleaned_seen = self.watchdog.cleaned_count
            still = []
            for rt in self.cleaning:
                if rt.clean.is_set():
                    self._forget(rt)
                else:
                    still.append(rt)
            self.cleaning = still
        if (self.state is State.PREEMPTING and not self.active and not self.settling
                and self.s.scheduled_events_ack and not self.preempt_acked
                and self.poller is not None and self.preempt_event is not None):
            self.preempt_acked = self.poller.acknowledge(self.preempt_event.event_id)
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
        if self.watchdog_ping is not None and now >= self.next_ping:
            keepers = [rt.keeper for rt in self.active] + self.settling
            stalled = [k.task_id for k in keepers if not k.healthy(now)]
            if stalled:
                if not self.stalled_logged:
                    log.error("lease thread(s) stalled for %s: withholding the systemd "
                              "watchdog ping", ", ".join(stalled))
                    self.stalled_logged = True
            else:
                self.stalled_logged = False
                self.notifier.watchdog()
            self.next_ping = now + self.watchdog_ping
        if self.notifier.enabled and now >= self.next_status:
            c = self.counts
            text = (f"{self.state.value}: running={len(self.active)} "
                    f"succeeded={c['succeeded']} failed={c['failed']} "
                    f"requeued={c['requeued']} lock_lost={c['lock_lost']}")
            if text != self.last_status:
                self.notifier.status(text)
                self.last_status = text
            self.next_status = now + STATUS_EVERY
        if self.metrics.enabled and now >= self.next_metrics:
            self.metrics.set_running(len(self.active))
            self.metrics.write()
            self.next_metrics = now + self.s.metrics_interval

    def _finished(self) -> bool:
        if self.state in (State.STOPPING, State.DRAINING):
            return not self.active and not self.settling and not self.starting
        if self.state is State.PREEMPTING:
            return False  # the VM goes away, or the event is cancelled and we go on
        if self.s.exit_when_empty and self._empty():
            self.stop_reason = "queue empty"
            return True
        return False

    def _empty(self) -> bool:
        if self.active or self.starting or self.settling or self.last_empty_receive is None:
            return False
        for back in self.awaiting_return.values():
            if isinstance(back, tuple):  # a retry: visible `delay` after its release was written
                keeper, delay = back
                if keeper.finished_at is None:
                    return False
                back = keeper.finished_at + delay
            if self.last_empty_receive < back:
                return False
        return True

    def _check_limits(self, now: float) -> None:
        if self.s.time_limit is not None and now >= self.started_at + self.s.time_limit:
            self.begin_stop("worker time limit reached", EXIT_OK)
        elif (self.s.idle_timeout is not None and not self.active
              and now - self.idle_since >= self.s.idle_timeout):
            self.begin_stop("idle timeout", EXIT_OK)

    # ------------------------------------------------------------------------- receive
    def _running(self) -> int:
        """Tasks whose shell has not exited: an exited one no longer takes a slot."""
        return sum(1 for rt in self.active if rt.exited_at is None)

    def _receive(self, now: float) -> None:
        free = self.s.num_workers - self._running() - len(self.starting)
        if free <= 0:
            return
        if now < self.next_receive and not (
                self.change_probe is not None and self.receive_backoff == 0
                and self.change_probe()):
            return
        t_sent = self.clock()
        try:
            leases = self.backend.receive(free, self.s.lock)
        except BackendConfigError:
            raise
        except BackendError as exc:
            self.metrics.backend_error("receive")
            self.receive_backoff = min(max(1.0, self.receive_backoff * 2), BACKEND_RETRY_MAX)
            log.warning("receive failed (retrying in %.0fs): %s", self.receive_backoff, exc)
            self.next_receive = self.clock() + self.receive_backoff
            return
        self.receive_backoff = 0.0
        self.metrics.receive_ok()
        if not self.ready_sent:
            self.notifier.ready()
            self.ready_sent = True
            # once ready, not before: a run stopped by a config error stays one line
            self.guard.log_warnings()
        if len(leases) < free:
            self.next_receive = t_sent + self.s.poll_interval
            if not leases:
                self.last_empty_receive = t_sent
        for lease in leases:
            self._dispatch(lease, t_sent)

    def _dispatch(self, lease: Lease, t_sent: float) -> None:
        task = lease.task
        task_id = task.id if task is not None else lease.message_id
        self.awaiting_return.pop(task_id, None)
        keeper = LeaseKeeper(lease, task_id, t_sent=t_sent, granted=lease.lock_duration,
                             renew_interval=self.s.renew_every, clock=self.clock,
                             on_lost=self.watchdog.wake, on_renewal=self.metrics.renewal)
        max_attempts = (task.max_attempts if task is not None else None) or self.s.max_attempts
        if self._reject(lease, keeper, task_id, max_attempts):
            return
        assert task is not None
        # One INFO line per start, not two: log records are a good part of a short task's
        # cost to the supervisor.  The "started" line carries the attempt and the command.
        log.debug("received task (attempt %d of %d)", lease.attempt, max_attempts,
                  extra={"task_id": task_id, "attempt": lease.attempt})
        self._seq += 1
        env = dict(self.base_env)
        env.update(JOBQ_TASK_ID=task.id, JOBQ_QUEUE_NAME=self.s.queue,
                   JOBQ_ATTEMPT=str(lease.attempt), **self.guard.environment())
        env.update(task.env)
        marker = f"{self.token}:{self._seq}"
        job = SpawnJob(task.cmd, env, task.cwd, marker, context=(lease, keeper, max_attempts),
                       options=self.guard.spawn_options(marker))
        self.starting.append(job)
        self.spawner.submit(job)
        # The keeper's thread starts when its first renewal draws near (``_start_keepers``)
        # or at the settlement, whichever comes first.
        self.next_keeper_start = min(self.next_keeper_start, keeper.start_by)

    def _start_keepers(self, now: float) -> None:
        """Start the keeper threads whose first renewal draws near (main thread)."""
        if now < self.next_keeper_start:
            return
        keepers = [rt.keeper for rt in self.active] + [job.context[1] for job in self.starting]
        pending = []
        for keeper in keepers:
            if not keeper.started:
                # Those due within a second start now too: one scan starts a whole wave.
                if now + KEEPER_START_AHEAD >= keeper.start_by:
                    keeper.start()
                else:
                    pending.append(keeper.start_by)
        self.next_keeper_start = min(pending, default=math.inf)

    def _reject(self, lease: Lease, keeper: LeaseKeeper, task_id: str,
                max_attempts: int) -> bool:
        """Dead-letter a message that must not run; True if it was (main thread)."""
        task = lease.task
        if task is None:
            reason = f"bad message: {lease.format_error}"
            log.error("%s; dead-lettering it", reason, extra={"task_id": task_id})
            return self._dead_letter(keeper, reason, lease.raw_body[-2000:])
        refusal = self.guard.refusal(task, time.time())
        if refusal is not None:  # never run: the message may come from anyone who can write
            log.error("%s; dead-lettering it without a run", refusal, extra={"task_id": task_id})
            return self._dead_letter(keeper, refusal, "")
        if lease.attempt > max_attempts:
            reason = f"attempts exhausted ({lease.attempt - 1} of {max_attempts} used)"
            log.error("%s; failing it without a run", reason, extra={"task_id": task_id})
            self._settle(keeper, lambda le: le.dead_letter(reason, "", None), "failed")
            self.counts["failed"] += 1
            return True
        return False

    def _dead_letter(self, keeper: LeaseKeeper, reason: str, detail: str) -> bool:
        self._settle(keeper, lambda le: le.dead_letter(reason, detail, None), "dead-lettered")
        self.counts["dead_lettered"] += 1
        self.metrics.task_dead_lettered()
        return True

    def _spawned(self, job: SpawnJob) -> None:
        """A spawner thread is done with ``job``: register the task (main thread)."""
        self.starting.remove(job)
        lease, keeper, max_attempts = job.context
        task = lease.task
        task_id = task.id
        proc = job.proc
        if proc is None:
            exc = job.error
            assert exc is not None
            reason = f"spawn failed: {getattr(exc, 'strerror', None) or exc}" + (
                f" (cwd {task.cwd})" if task.cwd and isinstance(exc, FileNotFoundError) else "")
            log.error("%s", reason, extra={"task_id": task_id})
            self._failed(keeper, task_id, lease.attempt, max_attempts, reason, "", None)
            return
        if self.lifeline is not None:
            self.lifeline.register(proc.pgid)
        now = self.clock()
        rt = RunningTask(task_id=task_id, attempt=lease.attempt, proc=proc, keeper=keeper,
                         started=now, lease=lease, task=task,
                         time_limit_at=now + self.s.task_time_limit
                         if self.s.task_time_limit else None)
        log_file = None
        if self.s.task_log_dir:
            # The id comes from the message: never let it name a path outside the directory.
            safe_id = re.sub(r"[^A-Za-z0-9_-]", "_", task_id)[:128]
            log_file = os.path.join(self.s.task_log_dir, f"{safe_id}.{lease.attempt}.log")
        assert proc.popen.stdout is not None
        proc.output = TaskOutput(task_id, proc.popen.stdout, lambda: self.events.put(None),
                                 task_log, log_file)
        self.metrics.task_started()
        log.info("started pid=%d pgid=%d (attempt %d of %d): %s", proc.pid, proc.pgid,
                 lease.attempt, max_attempts, _short(task.cmd),
                 extra={"task_id": task_id, "pid": proc.pid, "attempt": lease.attempt})
        self.output_pump.add(proc.output)
        self.active.append(rt)
        if self.state in (State.STOPPING, State.PREEMPTING):
            rt.stop_reason = "preempted"
        self.watchdog.add(rt)

    # ------------------------------------------------------------------------ reaping
    def _reap(self, now: float) -> None:
        leftovers = False
        if child_exited():
            for rt in self.active:
                if rt.exited_at is None and rt.proc.poll() is not None:
                    rt.exited_at = now
                    # Processes left in the group: the watchdog sees to them now.  Leftovers
                    # that left the group are found by its next regular check (within a
                    # second); waking it for every clean exit cost more than the check itself.
                    leftovers = leftovers or rt.proc.group_alive()
                    if self.state is State.RUNNING:
                        self.next_receive = min(self.next_receive, now)
        # Orphans (leftovers of exited shells) are reaped soon while some are being cleaned
        # up, else now and then; not on every exit, which would cost every task a /proc read.
        busy = self.watchdog.cleanup_busy
        if busy:
            self.next_orphan_reap = min(self.next_orphan_reap, now + ORPHAN_REAP_BUSY)
        if now >= self.next_orphan_reap and not self.starting:
            registered = {rt.proc.pid for rt in self.active if rt.exited_at is None}
            reap_orphans(registered | self._helper_pids())
            self.next_orphan_reap = now + (ORPHAN_REAP_BUSY if busy else ORPHAN_REAP_EVERY)
        if leftovers:
            self.watchdog.wake()  # leftovers of exited shells

    def _settle_exited(self, now: float) -> None:
        still = []
        for rt in self.active:
            if rt.exited_at is None or not self._ready_to_settle(rt, now):
                still.append(rt)
                continue
            self._conclude(rt, now)
            if rt.clean.is_set():  # the watchdog found its tree gone before this turn
                self._forget(rt)
            else:
                self.cleaning.append(rt)
            self.idle_since = now
        self.active = still

    def _ready_to_settle(self, rt: RunningTask, now: float) -> bool:
        assert rt.exited_at is not None
        output_done = rt.proc.output is None or rt.proc.output.closed.is_set()
        if not output_done and now < rt.exited_at + OUTPUT_GRACE:
            return False
        rc = rt.proc.returncode
        if (rc in (-signal.SIGTERM, 128 + signal.SIGTERM) and rt.term_reason is None
                and self.state is State.RUNNING
                and now < rt.exited_at + EXTERNAL_SIGTERM_GRACE):
            return False  # killed from outside (systemd control-group): a stop may follow
        return True

    def _forget(self, rt: RunningTask) -> None:
        self.watchdog.remove(rt)
        if self.lifeline is not None:
            self.lifeline.unregister(rt.proc.pgid)

    # --------------------------------------------------------------------- settlement
    def _settle(self, keeper: LeaseKeeper, settlement: Callable[[Lease], None] | None,
                description: str) -> None:
        keeper.finish(settlement, description)
        keeper.start()  # no-op if it runs already (or was done without a thread)
        self.settling.append(keeper)

    def _conclude(self, rt: RunningTask, now: float) -> None:
        rc = rt.proc.returncode
        assert rc is not None
        duration = now - rt.started
        tail = rt.proc.output.text() if rt.proc.output is not None else ""
        keeper = rt.keeper
        status = describe_exit(rc)
        extra = {"task_id": rt.task_id, "exit_status": rc, "duration": round(duration, 3)}
        if rt.lock_loss_handled or keeper.lost():
            log.error("finished after lock loss (%s, %.1fs); not settled: the message comes "
                      "back through the broker", status, duration, extra=extra)
            self._settle(keeper, None, "lock lost")
            self.counts["lock_lost"] += 1
            self.metrics.lock_lost()
            self.awaiting_return[rt.task_id] = (
                keeper.expires + self.backend.lost_lease_return_delay + self.s.poll_interval)
            return
        preempted = rt.stop_reason is not None or (
            self.state is State.STOPPING and rc in (-signal.SIGTERM, 128 + signal.SIGTERM))
        if preempted:
            log.warning("preempted (%s, %.1fs): back to the queue, attempt not counted",
                        status, duration, extra=extra)
            self._settle(keeper, lambda le: le.release(count_attempt=False), "requeued")
            self.counts["requeued"] += 1
            self.metrics.task_requeued()
            return
        if rc == 0 and rt.term_reason is None:
            log.info("finished: %s in %.1fs", status, duration, extra=extra)
            self._settle(keeper, lambda le: le.complete(), "completed")
            self.counts["succeeded"] += 1
            self.metrics.task_succeeded()
            self.consecutive_failures = 0
            return
        if rt.term_reason == "time limit":
            reason = f"task time limit of {self.s.task_time_limit:g}s exceeded ({status})"
        else:
            reason = status if rt.term_reason else self.guard.annotate_failure(
                status, rc, tail, rt.proc.marker)
        log.warning("finished: %s in %.1fs", reason, duration, extra=extra)
        max_attempts = (rt.task.max_attempts if rt.task is not None else None) or \
            self.s.max_attempts
        self._failed(keeper, rt.task_id, rt.attempt, max_attempts, reason, tail, rc)

    def _failed(self, keeper: LeaseKeeper, task_id: str, attempt: int, max_attempts: int,
                reason: str, tail: str, rc: int | None) -> None:
        self.metrics.task_failed()
        if attempt >= max_attempts:
            full = f"{reason}; attempt {attempt} of {max_attempts}, giving up"
            log.error("failed for good: %s", full, extra={"task_id": task_id})
            self._settle(keeper, lambda le: le.dead_letter(full, tail, rc), "failed")
            self.counts["failed"] += 1
            self.metrics.task_dead_lettered()
        else:
            # The exponent is capped: 2**1100 does not fit a float.
            delay = min(self.s.retry_delay * 2 ** min(attempt - 1, 60), self.s.retry_delay_max)
            log.info("will retry in %.0fs (attempt %d of %d failed)", delay, attempt,
                     max_attempts, extra={"task_id": task_id})
            self._settle(keeper, lambda le: le.release(count_attempt=True, delay=delay),
                         "retry")
            self.awaiting_return[task_id] = (keeper, delay)
            self.counts["retried"] += 1
        self.consecutive_failures += 1
        limit = self.s.max_consecutive_failures
        if limit and self.consecutive_failures >= limit and self.state is State.RUNNING:
            log.error("%d tasks failed in a row: stopping (--max-consecutive-failures)",
                      self.consecutive_failures)
            self.begin_stop("too many consecutive failures", EXIT_FAILURES)


def _short(text: str, limit: int = 200) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."
