"""From a received lease to a running task: keeper, environment, spawn, registration.

Main thread only.  The fork itself happens on the spawner's threads (worker/spawner.py); the main
loop
hands each finished ``SpawnJob`` back to ``Launcher.spawned``.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import queue
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..backends.base import Lease
from ..core.settings import Settings
from ..core.shown import shown
from ..fleet.output.base import AttemptKey
from .events import WAKE, Event, TaskStart
from .keeper import LeaseKeeper
from .lifeline import Lifeline
from .logs import log_fast
from .metrics import Metrics
from .output_pump import OutputPump, TaskOutput
from .process import task_environment
from .receive_ahead import LOST, START, Held, ReceiveAhead
from .settlement import Settlement, attempts_allowed, cancel_reason, spawn_not_retried
from .spawner import Spawner, SpawnJob
from .task_guard import TaskGuard
from .watchdog import RunningTask, Watchdog

if TYPE_CHECKING:  # a worker with --control off loads none of fleet/control
    from ..fleet.control.records import Cancel

log = logging.getLogger("jobq.worker")
task_log = logging.getLogger("jobq.task")

SPAWN_THREADS = 2
KEEPER_START_AHEAD = 1.0


@dataclass(eq=False)
class Launcher:
    """Starts tasks for leases (main thread only).

    ``starting`` holds the jobs submitted to the spawner and not yet back; ``lifeline`` is set
    by the worker once its helper runs.  Spawner results and task output closing wake the main
    loop through ``events``."""

    s: Settings
    guard: TaskGuard
    settlement: Settlement
    metrics: Metrics
    watchdog: Watchdog
    output_pump: OutputPump
    events: queue.SimpleQueue[Event]
    token: str
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        settings, settlement, clock = self.s, self.settlement, self.clock
        self._seq = 0
        self.lifeline: Lifeline | None = None
        self.spawner: Spawner[TaskStart] = Spawner(SPAWN_THREADS, on_done=self.events.put)
        self.starting: list[SpawnJob[TaskStart]] = []  # submitted to the spawner, not yet back
        self.next_keeper_start = math.inf  # the earliest start_by of a keeper not started
        # The inherited environment minus secrets, computed once: os.environ does not change.
        self.base_env = task_environment(dict(os.environ), {"PYTHONUNBUFFERED": "1"},
                                         settings.pass_env)
        backend = settlement.backend
        self.held = ReceiveAhead(lock=settings.lock, slots=settings.num_workers,
                                 can_hold=backend.receive_ahead,
                                 max_receive=backend.max_receive, clock=clock)
        # task id -> Cancel, kept by the control thread (fleet/directives.py; several queues:
        # a ChainMap over their agents' caches, fleet/agent_group.py); read only here
        self.cancels: Mapping[str, Cancel] = {}

    def start(self) -> None:
        self.spawner.start()

    def stop(self) -> None:
        self.spawner.stop()

    # -- receive-ahead (the rules: worker/receive_ahead.py)
    # -----------------------------------------------
    @property
    def ready(self) -> collections.deque[Held]:
        """The leases received ahead and not started yet."""
        return self.held.ready

    def ahead(self, free: int) -> int:
        """How many leases a receive for ``free`` slots may take beyond them (main thread).

        Each receive costs a round trip (and on SQLite a commit); taking more at once cuts
        what a short task costs the main loop, and on Azure the calls per task."""
        return self.held.extra(free)

    @property
    def recent_duration(self) -> float | None:
        """Moving average of the tasks' run times (None before the first ended)."""
        return self.held.recent_duration

    def note_duration(self, seconds: float) -> None:
        """A task ran this long (main thread)."""
        self.held.note_duration(seconds)

    def hold(self, leases: Sequence[Lease], t_sent: float) -> None:
        """Keep ``leases`` for the next free slots (main thread)."""
        self.held.hold(leases, t_sent)
        for lease in leases:
            log.debug("received ahead: held for the next free slot",
                      extra={"task_id": _task_id(lease)})

    def expire_ready(self, now: float) -> float:
        """Give back the held leases that may no longer start; return when the next one must
        go (main thread)."""
        for held, verdict in self.held.due(now):
            self._unhold(held, verdict, f"not started within {self.held.hold_bound:.1f}s")
        return self.held.next_due()

    def next_ready_due(self) -> float:
        """When the first held lease must go if it has not started (inf: none held; main
        thread).  Read live: a wake-up time kept aside went stale once a pause or a drain
        gave the held leases back, and the idle loop then spun on it."""
        return self.held.next_due()

    def take_ready(self, free: int) -> int:
        """Start up to ``free`` held leases; return how many slots they took (main thread).

        A held lease is started only within its bounds (worker/receive_ahead.py), checked on the
        clock now:
        the main loop may have been held up since the turn began."""
        taken = 0
        while taken < free and (item := self.held.pop(self.clock())) is not None:
            held, verdict = item
            if verdict == START:
                self.dispatch(held.lease, held.t_sent)
                taken += 1
            else:
                self._unhold(held, verdict, f"not started within {self.held.hold_bound:.1f}s")
        return taken

    def release_ready(self) -> None:
        """Give every held lease back to the queue, attempt not counted (main thread): the
        worker stops, drains, pauses or is preempted."""
        if self.held.ready:
            for held, verdict in self.held.pop_all(self.clock()):
                self._unhold(held, verdict, "the worker starts no more tasks")

    def _unhold(self, held: Held, verdict: str, why: str) -> None:
        """A held lease that will not start: released on its keeper's thread (the main loop
        never waits for the call), or, past its deadline, left to the broker (main thread)."""
        lease = held.lease
        task_id = _task_id(lease)
        keeper = self._keeper(lease, task_id, held.t_sent)
        if verdict == LOST:
            log.warning("received ahead, not started: its lease deadline passed while it was "
                        "held; not settled: %s", self.settlement.backend.lost_lease_return,
                        extra={"task_id": task_id})
        else:
            log.debug("received ahead, not started: back to the queue (%s)", why,
                      extra={"task_id": task_id})
        self.settlement.unstarted(keeper, task_id, lost=verdict == LOST)

    def cancel_starting(self) -> None:
        """The worker stops: spawns submitted and not yet forked never start (main thread).

        Each comes back through ``spawned`` unforked, and its lease goes back to the queue,
        attempt not counted."""
        for job in self.starting:
            job.cancelled = True

    # -- start ---------------------------------------------------------------------------
    def _keeper(self, lease: Lease, task_id: str, t_sent: float) -> LeaseKeeper:
        return LeaseKeeper(lease, task_id, t_sent=t_sent, granted=lease.lock_duration,
                           renew_interval=self.s.renew_every, clock=self.clock,
                           on_lost=self.watchdog.wake, on_renewal=self.metrics.renewal,
                           comes_back=self.settlement.backend.lost_lease_return)

    def dispatch(self, lease: Lease, t_sent: float) -> None:
        """Submit a spawn for ``lease``, or dead-letter it if it must not run (main thread)."""
        task = lease.task
        task_id = _task_id(lease)
        if (name := lease.queue) != self.s.queue:  # one of several queues
            self.settlement.results.note_queue(task_id, name)
        self.settlement.returned(task_id)
        keeper = self._keeper(lease, task_id, t_sent)
        max_attempts = attempts_allowed(task, self.s)
        if self.settlement.reject(lease, keeper, task_id, max_attempts):
            return
        if self.cancels and (cancel := self.cancels.get(task_id)) is not None:
            # cancelled before it was received: it never runs (a dict lookup, no store call)
            self.settlement.cancelled(keeper, task_id, lease.attempt,
                                      f"{cancel_reason(cancel)} (before it started)", "", None,
                                      by=cancel.who)
            return
        assert task is not None
        # One INFO line per start, not two: log records are a good part of a short task's
        # cost to the supervisor.  The "started" line carries the attempt and the command.
        log.debug("received task (attempt %d of %d)", lease.attempt, max_attempts,
                  extra={"task_id": task_id, "attempt": lease.attempt})
        self._seq += 1
        env = dict(self.base_env)
        env.update(self.guard.environment())
        env.update(task.env)
        # after the message's env: a task cannot pose as another (issue 14)
        env.update(JOBQ_TASK_ID=task.id, JOBQ_QUEUE_NAME=lease.queue,
                   JOBQ_ATTEMPT=str(lease.attempt))
        marker = f"{self.token}:{self._seq}"
        job = SpawnJob(task.cmd, env, task.cwd, marker,
                       context=TaskStart(lease, task, keeper, max_attempts),
                       options=self.guard.spawn_options(marker), after_spawn=self.attach)
        self.starting.append(job)
        self.spawner.submit(job)
        # The keeper's thread starts when its first renewal draws near (``start_keepers``)
        # or at the settlement, whichever comes first.
        self.next_keeper_start = min(self.next_keeper_start, keeper.start_by)

    def start_keepers(self, now: float, active: list[RunningTask]) -> None:
        """Start the keeper threads whose first renewal draws near (main thread)."""
        if now < self.next_keeper_start:
            return
        keepers = [rt.keeper for rt in active] + [job.context.keeper for job in self.starting]
        pending = []
        for keeper in keepers:
            if not keeper.started:
                # Those due within a second start now too: one scan starts a whole wave.
                if now + KEEPER_START_AHEAD >= keeper.start_by:
                    keeper.start()
                else:
                    pending.append(keeper.start_by)
        self.next_keeper_start = min(pending, default=math.inf)

    def spawned(self, job: SpawnJob[TaskStart]) -> RunningTask | None:
        """A spawner thread is done with ``job``: the task to register, or None if the spawn
        failed (then the attempt is settled as failed) (main thread)."""
        self.starting.remove(job)
        lease, task, keeper = job.context.lease, job.context.task, job.context.keeper
        max_attempts = job.context.max_attempts
        task_id = task.id
        proc = job.proc
        if proc is None and job.error is None:  # cancelled before its fork
            log.info("not started (the worker is stopping): back to the queue, attempt not "
                     "counted", extra={"task_id": task_id, "attempt": lease.attempt})
            self.settlement.unstarted(keeper, task_id)
            return None
        if proc is None:
            exc = job.error
            assert exc is not None
            text = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
            reason = f"spawn failed: {text}" + (
                f" (cwd {task.cwd})" if task.cwd and getattr(exc, "filename", None) == task.cwd
                else "")
            final = spawn_not_retried(exc)
            if final is not None:
                reason = f"{reason}: {final}"
            log.error("%s", reason, extra={"task_id": task_id})
            self.settlement.failed(keeper, task_id, lease.attempt, max_attempts, reason, "",
                                   None, retry=final is None)
            return None
        if self.lifeline is not None:
            self.lifeline.register(proc.pgid, proc.marker, keeper)  # with its lease deadline
        now = self.clock()
        limit = time_limit(task.timeout, self.s.task_time_limit)
        rt = RunningTask(task_id=task_id, attempt=lease.attempt, proc=proc, keeper=keeper,
                         started=now, lease=lease, task=task, time_limit=limit,
                         time_limit_at=None if limit is None else now + limit)
        if proc.output is None:  # attach() failed on the spawner thread (a bug): do it here
            self.attach(job)
        self.metrics.task_started()
        self.settlement.results.started(task_id, lease.attempt, max_attempts, now)
        return rt

    def attach(self, job: SpawnJob[TaskStart]) -> None:
        """Right after the shell started: log "started" and hand its output pipe to the pump
        (spawner thread; the main thread only if that failed).

        On the spawner thread, not the main loop: the pipe's epoll registration lets go of
        the GIL and waited ~60 us for it back on the busy main loop; and the line comes
        before any line of the task's output."""
        proc = job.proc
        assert proc is not None and proc.popen.stdout is not None
        lease, task, max_attempts = job.context.lease, job.context.task, job.context.max_attempts
        task_logs = self.output_pump.task_logs  # --task-log-dir
        log_file = None if task_logs is None else task_logs.claim(task.id, lease.attempt)
        name = lease.queue
        output = TaskOutput(task.id, proc.popen.stdout, self._output_closed, task_log, log_file,
                            key=AttemptKey(name, task.id, lease.attempt),
                            log_file_done=None if task_logs is None else task_logs.release)
        log_fast(log, logging.INFO, "started pid=%d pgid=%d (attempt %d of %d)%s: %s", proc.pid,
                 proc.pgid, lease.attempt, max_attempts,
                 "" if name == self.s.queue else f" queue={name}", _short(task.cmd),
                 extra={"task_id": task.id, "pid": proc.pid, "attempt": lease.attempt})
        self.output_pump.add(output)
        proc.output = output

    def _output_closed(self) -> None:
        """A task's output reached EOF: wake the main loop (pump thread)."""
        self.events.put(WAKE)


def time_limit(task_timeout: float | None, worker_limit: float | None) -> float | None:
    """The smaller of the task's own timeout (push --timeout) and --task-time-limit (0 or
    None: none); None when neither applies."""
    limits = [t for t in (task_timeout, worker_limit) if t]
    return min(limits) if limits else None


def _task_id(lease: Lease) -> str:
    """The task's id, or the message's when the body is not a task."""
    return lease.task.id if lease.task is not None else lease.message_id


def _short(text: str, limit: int = 200) -> str:
    """A command for the "started" line: control and format characters written as ``\\n``,
    ``\\x1b``, ``\\u202e`` ... (``shown``), so that none can hide the task id on a terminal
    or reorder the line; escaped before it is cut, so the cut never splits an escape."""
    text = shown(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
