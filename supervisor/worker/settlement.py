"""What happens to a lease once its task is over, or once it must not run at all.

Main thread only.  ``Settlement`` is the one owner of how an attempt ended: it decides the
outcome (``outcomes.Ended``: complete, retry, dead-letter, requeue, leave a lost lease alone),
counts it, and hands it as one step (``Complete``, ``Release``, ``DeadLetter`` from
worker/settle_steps.py, or None) to the lease's keeper, which applies it on its thread and never
calls back here (on a backend with ``quick_settle``, SQLite, a short task's lease is settled
on this thread when the write is instant: see ``LeaseKeeper.settle_here``).  The keeper's
typed ``SettleResult`` comes back once it is done; a refused settlement is then counted as a
lost lease, and the result log is told (result_log.py: the attempt's record, corrected to
lock-lost).  It also remembers what this worker released and when it comes back
(``--exit-when-empty``).
"""

from __future__ import annotations

import errno
import functools
import logging
import signal
import time
from typing import TYPE_CHECKING, Callable

from ..backends.base import Backend, Lease
from ..core.outcome_counts import OutcomeCounts
from ..core.settings import Settings
from ..core.signals import describe_exit
from ..core.task import Task
from .completer import Completer
from .keeper import LeaseKeeper
from .logs import log_fast
from .metrics import Metrics
from .outcomes import Ended, SettleResult
from .result_log import ResultLog
from .settle_steps import Complete, DeadLetter, Release, SettleStep
from .task_guard import TaskGuard
from .watchdog import RunningTask

if TYPE_CHECKING:  # built only with a control store: not imported without one
    from ..fleet.control.records import Cancel, ResultRecord

log = logging.getLogger("jobq.worker")


# Settlements in flight (keeper threads applying a step, each holding a thread and a lease) at
# which the worker takes no new lease until some finish: SETTLING_PER_SLOT per slot, at least
# SETTLING_MIN.  A slot is free once its shell exits, whatever its settlement does, so a broker
# slow to settle would otherwise let a fleet of short tasks pile up threads and held messages
# without end.
SETTLING_PER_SLOT = 4
SETTLING_MIN = 8

COMPLETER_LOOK = 0.05  # s: at exit, how often to look for completions handed back

PER_QUEUE = ("succeeded", "failed", "dead_lettered")  # what a worker record shows




def attempts_allowed(task: Task | None, settings: Settings) -> int:
    """The message's own max_attempts, else the worker's (any thread)."""
    return (task.max_attempts if task is not None else None) or settings.max_attempts


def cancel_reason(cancel: Cancel) -> str:
    """The failed-state reason of a cancelled task (any thread): the words of
    ``control.records.cancel_reason``, which jobq-ctl uses too.  Imported here, not at the top:
    a cancel comes only from a control store, and a worker with ``--control off`` loads none
    of fleet/control/ (docs/architecture.rst, "Modules")."""
    from ..fleet.control.records import cancel_reason as words

    return words(cancel)


# What bash's own exit statuses mean: the reason of a task failed at once for one says it.
EXIT_MEANINGS = {126: "command cannot execute", 127: "command not found"}
# A spawn that failed for want of the worker's resources says nothing about the task: it is
# retried like any failed attempt.  Every other spawn failure (a missing or inaccessible
# --cwd, a string the OS cannot take) would fail again on every worker: final at once.
SPAWN_RETRIED = frozenset({errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE})


def exit_not_retried(settings: Settings, rc: int) -> str | None:
    """Why a task that exited with ``rc`` by itself is not retried (``--no-retry-exit-codes``),
    or None when it is (any thread)."""
    if rc not in settings.no_retry_exit_codes:
        return None
    meaning = EXIT_MEANINGS.get(rc)
    return f"{meaning + ', ' if meaning else ''}not retried (--no-retry-exit-codes)"


def spawn_not_retried(exc: BaseException) -> str | None:
    """Why a task whose shell could not be started is not retried, or None when it is
    (main thread)."""
    if isinstance(exc, OSError) and exc.errno in SPAWN_RETRIED:
        return None
    return "the task cannot start, not retried"


def retry_delay(settings: Settings, attempt: int) -> float:
    """Exponential backoff before a failed attempt is visible again (any thread)."""
    # The exponent is capped: 2**1100 does not fit a float.
    return min(settings.retry_delay * 2 ** min(attempt - 1, 60), settings.retry_delay_max)


class Settlement:
    """Outcomes of this worker's leases (main thread only).

    ``on_failure_streak(n)`` is called after the n-th failure in a row once n reaches
    ``--max-consecutive-failures``; the worker decides whether to stop.  ``results.sink`` (set
    by the worker when it has a control store) receives each attempt's result record; it
    must not block.  ``clock`` is the monotonic clock of ``RunningTask.started``."""

    def __init__(self, settings: Settings, backend: Backend, guard: TaskGuard,
                 metrics: Metrics, on_failure_streak: Callable[[int], None], *,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 wake: Callable[[], None] | None = None) -> None:
        """``wake``: makes the main loop look again now (any thread; the completer's)."""
        self.s = settings
        self.backend = backend
        self.guard = guard
        self.metrics = metrics
        self.on_failure_streak = on_failure_streak
        self.settling: list[LeaseKeeper] = []  # settlement running on the keeper thread
        self.max_settling = max(SETTLING_MIN, SETTLING_PER_SLOT * settings.num_workers)
        self._backlog_logged = False  # a "settlements backlogged" line is out, no "caught up"
        self.overdue: list[LeaseKeeper] = []  # past their deadline, not yet done
        # SQLite's: a short task's lease is settled on this thread when the write is instant
        self.quick_settle = backend.quick_settle
        # PostgreSQL's: the succeeded tasks of a turn are completed together, on the
        # completer's thread (``flush``; worker/completer.py)
        self.batch_complete = backend.batch_complete
        self.batch: list[LeaseKeeper] = []  # handed to the completer at the next ``flush``
        self.completer = Completer(backend, wake)
        # task id -> (its keeper, delay, "released" | "lost"): what this worker gave back (or
        # lost) and when it is visible again -- see all_back_by
        self.awaiting_return: dict[str, tuple[LeaseKeeper, float, str]] = {}
        self.results = ResultLog(settings.queue, settings.worker_id, clock=clock, wall=wall)
        self.consecutive_failures = 0
        self.counts = {"succeeded": 0, "failed": 0, "retried": 0, "requeued": 0,
                       "lock_lost": 0, "dead_lettered": 0, "cancelled": 0}
        # queue -> the counts a worker record shows (PER_QUEUE), for a worker's several queues
        self.per_queue: dict[str, dict[str, int]] = {}

    # ------------------------------------------------------------------- bookkeeping
    def _count(self, keeper: LeaseKeeper, name: str, delta: int = 1) -> None:
        """Count an outcome of ``keeper``'s task, in all and for its queue (main thread)."""
        self.counts[name] += delta
        if name in PER_QUEUE:
            per = self.per_queue.setdefault(keeper.lease.queue, dict.fromkeys(PER_QUEUE, 0))
            per[name] = max(0, per[name] + delta)

    def snapshot(self) -> OutcomeCounts:
        """A copy of the counts, with one of each queue's (main or control thread: a dict
        copy under the GIL, as the worker record always took)."""
        counts = OutcomeCounts(self.counts)
        counts.per_queue = {q: dict(c) for q, c in list(self.per_queue.items())}
        return counts

    def returned(self, task_id: str) -> None:
        """``task_id`` was received again: nobody waits for it any more (main thread)."""
        self.awaiting_return.pop(task_id, None)

    def all_back_by(self, t: float) -> bool:
        """Everything this worker released was visible on the queue by ``t`` (main thread)."""
        for keeper, delay, kind in self.awaiting_return.values():
            if kind == "lost":  # back `delay` after the lock the broker last granted ends
                if keeper.call_started is not None:  # a renewal may still extend it
                    return False
                back = keeper.expires + delay
            else:  # a release: visible `delay` after it was written
                if keeper.finished_at is None:
                    return False
                back = keeper.finished_at + delay
            if t < back:
                return False
        return True

    def streak_may_end(self, active: list[RunningTask]) -> bool:
        """Settling the failed tasks whose shell exited may reach --max-consecutive-failures
        (main thread): then the worker starts nothing before they are settled."""
        limit = self.s.max_consecutive_failures
        if not limit:
            return False
        failing = sum(1 for rt in active if rt.exited_at is not None and not rt.cancel_handled
                      and (rt.proc.returncode != 0 or rt.term_reason is not None))
        return failing > 0 and self.consecutive_failures + failing >= limit

    def in_flight(self) -> int:
        """Settlements not over yet: handed to a keeper thread, or past their deadline with a
        call still hung (main thread)."""
        return (sum(1 for k in self.settling if not k.done.is_set())
                + sum(1 for k in self.overdue if not k.done.is_set()))

    def holds_starts(self, active: list[RunningTask]) -> bool:
        """Start nothing now, not even a lease held ahead: a failure streak may stop the
        worker, or settlements are at their bound (main thread)."""
        return self.streak_may_end(active) or self.backlogged(active)

    def backlogged(self, active: list[RunningTask]) -> bool:
        """True while ``max_settling`` settlements are in flight or due (a shell of
        ``active`` exited, its settlement not handed over yet): the worker then receives
        nothing and starts nothing held ahead until some are over, so at most
        ``max_settling`` + slots - 1 are ever in flight (main thread)."""
        n = self.in_flight() + sum(1 for rt in active if rt.exited_at is not None)
        full = n >= self.max_settling
        if full != self._backlog_logged:
            self._backlog_logged = full
            if full:
                log.warning("%d settlements in flight (the broker is slow to settle): no new "
                            "task until fewer than %d are", n, self.max_settling)
            else:
                log.info("settlements caught up (%d in flight): receiving again", n)
        return full

    def prune(self) -> None:
        """Forget the keepers that are done settling; start the thread of each whose
        completion the completer could not make, to retry it (main thread)."""
        if self.batch_complete:
            for keeper in self.completer.take_retries():
                keeper.start()
        # A keeper whose lease deadline passed will not settle (and may be stuck in a hung
        # call): its message comes back by the backend's own means (``lost_lease_return``),
        # so nobody waits for it -- but how it ended is still counted once it is done
        # (``_settled``).
        still = []
        for k in self.settling:
            if k.done.is_set():
                self._settled(k)
            elif k.lost():
                self.overdue.append(k)
            else:
                still.append(k)
        self.settling = still
        if self.overdue:
            for k in [k for k in self.overdue if k.done.is_set()]:
                self.overdue.remove(k)
                self._settled(k)

    def _settled(self, keeper: LeaseKeeper, result: SettleResult | None = None) -> None:
        """``keeper`` is done, with ``result`` (default: its own); tell the result log.  A
        settlement the broker refused (or the deadline overtook) did not happen: the message
        comes back, so the run counts as a lost lease, not as what was decided (and its result
        record says so)."""
        result = result or keeper.result
        assert result is not None  # ``finish`` set it before the keeper was handed here
        self.results.settled(keeper, result)
        if not result.refused:
            return
        decided = result.ended.count
        if decided is not None and self.counts[decided] > 0:
            self._count(keeper, decided, -1)
        self.counts["lock_lost"] += 1
        self.metrics.lock_lost()

    # ------------------------------------------------------------------- outcomes
    def settle(self, keeper: LeaseKeeper, step: SettleStep | None, ended: Ended,
               record: ResultRecord | None = None) -> None:
        """The attempt ``ended`` so: count it, hand ``step`` to ``keeper`` (None: settle
        nothing) and see it applied, and ``record`` (the attempt's end) to the result log
        (main thread).  What became of the step comes back in ``_settled``."""
        keeper.finish(step, ended)
        if ended.count is not None:
            self._count(keeper, ended.count)
        task = keeper.lease.task
        self.results.hand_over(record, task.unique_key if task is not None else None, keeper)
        if (self.batch_complete and isinstance(step, Complete) and not keeper.started
                and not keeper.lost()):
            self.batch.append(keeper)  # completed with the others of this turn: ``flush``
            return
        if self.quick_settle and not keeper.started:
            with self.backend.quick_writes():
                result = keeper.settle_here()
            if result is not None:
                self._settled(keeper, result)
                return
        keeper.start()  # no-op if it runs already (or was done without a thread)
        self.settling.append(keeper)

    def flush(self) -> None:
        """Hand the leases ``settle`` gathered to the completer, which completes them
        together (``Backend.complete_many``) on its thread; they are ``settling`` until it
        is done, and counted (refused: as lost) by ``prune`` as any settlement (main thread,
        at the end of each turn's settling)."""
        if self.batch:
            self.settling += self.batch
            self.completer.hand(self.batch)
            self.batch = []

    def settle_by(self, keeper: LeaseKeeper, within: float) -> None:
        """Wait until ``keeper`` is done or its thread runs, at most ``within`` seconds (main
        thread, at exit): a completion the completer could not make is started on the
        keeper's thread meanwhile (``prune``)."""
        end = time.monotonic() + within
        while not keeper.started and not keeper.join(COMPLETER_LOOK):
            if time.monotonic() >= end:
                return
            self.prune()

    def unstarted(self, keeper: LeaseKeeper, task_id: str, lost: bool = False) -> None:
        """A lease received and never started goes back to the queue, attempt not counted --
        or, ``lost`` (its deadline passed while it was held), is left to the broker, with no
        call (main thread)."""
        if lost:
            keeper.finish(None, Ended.EXPIRED)  # no thread, no call
            self.awaiting_return[task_id] = (
                keeper, self.backend.lost_lease_return_delay + self.s.poll_interval, "lost")
            return
        self.settle(keeper, Release(count_attempt=False), Ended.RETURNED)
        self.awaiting_return[task_id] = (keeper, 0.0, "released")

    def reject(self, lease: Lease, keeper: LeaseKeeper, task_id: str,
               max_attempts: int) -> bool:
        """Dead-letter a message that must not run; True if it was (main thread)."""
        task = lease.task
        if task is None:
            reason = f"bad message: {lease.format_error}"
            log.error("%s; dead-lettering it", reason, extra={"task_id": task_id})
            return self.dead_letter(keeper, reason, lease.raw_body[-2000:])
        refusal = self.guard.refusal(task, time.time(), queue=lease.queue)
        if refusal is not None:  # never run: the message may come from anyone who can write
            log.error("%s; dead-lettering it without a run", refusal, extra={"task_id": task_id})
            return self.dead_letter(keeper, refusal, "")
        if lease.attempt > max_attempts:
            reason = f"attempts exhausted ({lease.attempt - 1} of {max_attempts} used)"
            log.error("%s; failing it without a run", reason, extra={"task_id": task_id})
            self.settle(keeper, DeadLetter(reason), Ended.FAILED, self.results.ended(
                task_id, lease.attempt, "failed", max_attempts=max_attempts, final=True,
                reason=reason))
            return True
        return False

    def dead_letter(self, keeper: LeaseKeeper, reason: str, detail: str) -> bool:
        self.settle(keeper, DeadLetter(reason, detail), Ended.DEAD_LETTERED)
        self.metrics.task_dead_lettered()
        return True

    def conclude(self, rt: RunningTask, now: float, stopping: bool) -> None:
        """Settle a task whose shell exited (main thread); ``stopping``: the worker is."""
        rc = rt.proc.returncode
        assert rc is not None
        duration = now - rt.started
        tail = rt.proc.output.text() if rt.proc.output is not None else ""
        keeper = rt.keeper
        status = describe_exit(rc)
        max_attempts = attempts_allowed(rt.task, self.s)
        # Every "finished" line names the attempt: a retried task's lines tell its runs apart.
        of = f"attempt {rt.attempt} of {max_attempts}"
        extra = {"task_id": rt.task_id, "exit_status": rc, "duration": round(duration, 3),
                 "attempt": rt.attempt}
        if rt.lock_loss_handled or keeper.lost():
            log.error("finished after lock loss (%s, %.1fs, %s); not settled: %s", status,
                      duration, of, self.backend.lost_lease_return, extra=extra)
            self.settle(keeper, None, Ended.LOCK_LOST, self.results.ended(
                rt.task_id, rt.attempt, "lock-lost", max_attempts=max_attempts, rc=rc,
                reason=keeper.lost_reason or "lock lost", started=rt.started))
            self.metrics.lock_lost()
            # Read when asked, not now: a renewal still in flight may yet extend the lock.
            self.awaiting_return[rt.task_id] = (
                keeper, self.backend.lost_lease_return_delay + self.s.poll_interval, "lost")
            return
        if rt.cancel_handled and (cancel := rt.cancel) is not None:
            # carried out while it ran: whatever the exit, it is cancelled
            self.cancelled(keeper, rt.task_id, rt.attempt,
                           f"{cancel_reason(cancel)} ({status}, {of})", tail, rc,
                           by=cancel.who, started=rt.started)
            return
        preempted = rt.stop_reason is not None or (
            stopping and rc in (-signal.SIGTERM, 128 + signal.SIGTERM))
        if preempted:
            log.warning("preempted (%s, %.1fs): back to the queue, attempt not counted",
                        status, duration, extra=extra)
            self.settle(keeper, Release(count_attempt=False), Ended.REQUEUED,
                        self.results.ended(rt.task_id, rt.attempt, "requeued",
                                           max_attempts=max_attempts, rc=rc,
                                           reason=rt.stop_reason or "the worker stopped",
                                           started=rt.started))
            self.metrics.task_requeued()
            return
        if rc == 0 and rt.term_reason is None:
            log_fast(log, logging.INFO, "finished: %s in %.1fs (%s)", status, duration, of,
                     extra=extra)
            self.settle(keeper, Complete(), Ended.SUCCEEDED, self.results.ended(
                rt.task_id, rt.attempt, "succeeded", max_attempts=max_attempts, rc=rc,
                final=True, started=rt.started))
            self.metrics.task_succeeded()
            self.consecutive_failures = 0
            return
        if rt.term_reason == "time limit":
            # one text for push --timeout and --task-time-limit: the limit that applied
            reason = f"time limit {rt.time_limit or self.s.task_time_limit or 0:g}s exceeded " \
                     f"({status})"
        else:
            reason = status if rt.term_reason else self.guard.annotate_failure(
                status, rc, tail, rt.proc.marker)
        # Only an exit of its own: a status the worker's kill caused says nothing of the task.
        final = None if rt.term_reason else exit_not_retried(self.s, rc)
        if final is not None:
            reason = f"{reason}: {final}"
        log.warning("finished: %s in %.1fs (%s)", reason, duration, of, extra=extra)
        self.failed(keeper, rt.task_id, rt.attempt, max_attempts, reason, tail, rc,
                    started=rt.started, retry=final is None)

    def cancelled(self, keeper: LeaseKeeper, task_id: str, attempt: int, reason: str,
                  tail: str, rc: int | None, by: str = "",
                  started: float | None = None) -> None:
        """A cancelled task (ran or not; ``by``: the cancel's who, ``started``: monotonic,
        None if it never ran): to the failed state, never retried, counted as neither success
        nor failure (main thread)."""
        log.warning("%s: not retried", reason, extra={"task_id": task_id, "attempt": attempt})
        self.settle(keeper, DeadLetter(reason, tail, rc), Ended.CANCELLED, self.results.ended(
            task_id, attempt, "cancelled", rc=rc, final=True, reason=reason, tail=tail,
            cancelled_by=by, started=started,
            max_attempts=attempts_allowed(keeper.lease.task, self.s)))
        self.metrics.task_cancelled()

    def failed(self, keeper: LeaseKeeper, task_id: str, attempt: int, max_attempts: int,
               reason: str, tail: str, rc: int | None, started: float | None = None,
               retry: bool = True) -> None:
        """A failed attempt: retry with backoff, or dead-letter the last one -- or, when not
        ``retry`` (``reason`` says why), this one (main thread).

        Every backend's failed attempt ends here: SQLite's failed state, Storage Queue's
        ``-failed`` queue and Service Bus's dead-letter queue get the same decision."""
        self.metrics.task_failed()
        record = functools.partial(self.results.ended, task_id, attempt, "failed", rc=rc,
                                   tail=tail, started=started, max_attempts=max_attempts)
        if attempt >= max_attempts or not retry:
            full = f"{reason}; attempt {attempt} of {max_attempts}" + (
                ", giving up" if retry else "")
            log.error("failed for good: %s", full, extra={"task_id": task_id})
            self.settle(keeper, DeadLetter(full, tail, rc), Ended.FAILED,
                        record(final=True, reason=full))
            self.metrics.task_dead_lettered()
        else:
            delay = retry_delay(self.s, attempt)
            when = f"retried in {delay:.0f}s"
            if self.backend.no_retry_delay:  # say what happens, not what was asked
                delay, when = 0.0, f"back on the queue now ({self.backend.no_retry_delay})"
                log.info("will retry: %s (attempt %d of %d failed)", when, attempt,
                         max_attempts, extra={"task_id": task_id})
            else:
                log.info("will retry in %.0fs (attempt %d of %d failed)", delay, attempt,
                         max_attempts, extra={"task_id": task_id})
            self.settle(keeper, Release(count_attempt=True, delay=delay), Ended.RETRIED,
                        record(reason=f"{reason}; {when}"))
            self.awaiting_return[task_id] = (keeper, delay, "released")
        self.consecutive_failures += 1
        limit = self.s.max_consecutive_failures
        if limit and self.consecutive_failures >= limit:
            self.on_failure_streak(self.consecutive_failures)
