"""LeaseKeeper: one thread per lease -- renews it, tracks its deadline, settles it at the end.

The deadline rule (docs/architecture.rst, "The lease deadline rule"):
``deadline = t_sent + granted - margin`` where ``t_sent`` is the monotonic time the last
*successful* renewal (or the receive) was sent.  A renewal call never gets more time than is
left before the deadline, and the watchdog acts on the deadline alone, so a hung call cannot
delay the kill.  A definitive LeaseLost sets ``lock_lost`` at once.
The keeper never signals a process.

What the keeper does at the end is one settlement step it is handed -- ``Complete``,
``Release`` or ``DeadLetter`` (worker/settle_steps.py), each one broker call on the lease, or None
for
"settle nothing".  The keeper decides when and whether to run it (not after a lost lease,
retried after a BackendError while the lease lasts, renewing it meanwhile), never what it is:
that is worker/settlement.py's business, which tells it how the attempt ended (``outcomes.Ended``).
What became of the settlement is ``result`` (``outcomes.SettleResult``): a settlement that did
not happen says why -- refused (a definitive LeaseLost), the lease lost, or the service
unreachable until the lease ended -- and the result record and the log repeat it.
"""

from __future__ import annotations

import logging
import queue
import time
from datetime import datetime, timedelta, timezone
from typing import Callable

from ..backends.base import BackendError, Lease, LeaseLost
from ..core.settings import safety_margin
from ..core.threads import Flag, start_fast
from .outcomes import Ended, SettleResult, Unsettled
from .settle_steps import SettleStep

log = logging.getLogger("jobq.lease")

MAX_CALL_TIMEOUT = 30.0  # even a long lease's renewal call gives up after this
RETRY_AFTER_FAILURE = 2.0  # a failed renewal is retried this soon (or at renew_interval)
# A failed settlement is retried after 1 s, then twice as long each time up to this (and
# never past the lease deadline): an outage of the queue service must not turn every finished
# task into a call a second.
SETTLE_RETRY_MAX = 30.0
# The last settlement try is sent this long before the lease deadline (which keeps its safety
# margin before the lock itself ends): a wait never crosses the deadline.
SETTLE_LAST_TRY = 1.0
# A renewal while a settlement waits gives up after this (or at the next settlement try): a
# black-holed call must not eat the time left for the settlement's own last try.
RENEW_WHILE_SETTLING = 5.0
MIN_RENEW_CALL = 0.5  # a renewal is not worth sending with less time than this for it

def lease_deadline(t_sent: float, granted: float) -> float:
    """The kill deadline of a lock of ``granted`` seconds sent at ``t_sent`` (any thread)."""
    return t_sent + granted - safety_margin(granted)


def settle_retry_at(now: float, wait: float, deadline: float) -> float | None:
    """When to retry a settlement that failed at ``now`` (any thread): after ``wait``, but
    never later than the last try, SETTLE_LAST_TRY before ``deadline``; None when the try
    that failed was that last one (or came later)."""
    last = deadline - SETTLE_LAST_TRY
    if now >= last:
        return None
    return min(now + wait, last)


def next_renewal(t_sent: float, granted: float, renew_interval: float) -> float:
    """When to renew a lock of ``granted`` seconds sent at ``t_sent`` (any thread).

    Every ``renew_interval``, but well before this grant runs out, even when the broker
    granted less than the lock the interval was derived from."""
    return t_sent + min(renew_interval, max(0.0, (granted - safety_margin(granted)) / 2))


class LeaseKeeper:
    """Owns one lease.  ``start`` runs it on its own thread; tests drive ``step`` directly.

    Main thread: ``start``, ``finish``, ``settle_here``.  Completer thread:
    ``settled_together``.  Watchdog thread: reads
    ``deadline``/``lock_lost``.
    Keeper thread: everything else.
    """

    def __init__(self, lease: Lease, task_id: str, *, t_sent: float, granted: float,
                 renew_interval: float, clock: Callable[[], float] = time.monotonic,
                 on_lost: Callable[[], None] | None = None,
                 on_renewal: Callable[[float, bool], None] | None = None,
                 sleep: Callable[[float], None] | None = None,
                 comes_back: str = "the broker will hand the message out again") -> None:
        """``sleep``: how a settlement retry waits (tests pass their fake clock's advance);
        by default the keeper's own wake-up queue, so that ``finish`` still wakes it.
        ``comes_back``: how the backend gets back a lease nobody settles, for the log line."""
        self.comes_back = comes_back
        self.lease = lease
        self._retry_sleep: Callable[[float], None] = sleep or self._sleep
        self.task_id = task_id
        self.clock = clock
        self.renew_interval = renew_interval
        self.granted = granted
        self.deadline = lease_deadline(t_sent, granted)
        self.expires = t_sent + granted  # earliest the broker may hand the message out
        self.next_renew = next_renewal(t_sent, granted, renew_interval)
        self.lock_lost = Flag()
        self.lost_reason = ""
        self.renewals = 0
        self.failures = 0
        self.done = Flag()
        self.finished_at: float | None = None  # clock() when the settlement call returned
        # What became of the settlement (set by ``finish``; read once ``done`` is set).
        self.result: SettleResult | None = None
        self._gone = ""  # what a renewal while settling said when the broker refused it
        self._on_lost = on_lost
        self._on_renewal = on_renewal
        self.call_started: float | None = None  # a renewal call is in flight since then
        self.call_timeout = 0.0
        # The keeper thread sleeps on this (a C-level queue: cheaper per wake than an Event,
        # and 1,000 keepers wake 100 times a second between them).
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._step: SettleStep | None = None
        self._finish_requested = False
        self.started = False
        # The thread must run by then: halfway to the first renewal (see ``start``).
        self.start_by = t_sent + (self.next_renew - t_sent) / 2

    # -- main thread ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the keeper thread (once).

        The main loop starts it at ``start_by`` at the latest, or at ``finish``: most short
        tasks end long before their first renewal, and then the thread is needed only for the
        settlement.  Nothing else needs the thread: the deadline and ``lock_lost`` that the
        watchdog reads are set without it."""
        if not self.started:
            self.started = True
            start_fast(self._run)

    def finish(self, step: SettleStep | None, ended: Ended) -> None:
        """Stop renewing and apply ``step`` on the keeper thread (None: settle nothing) for an
        attempt that ``ended`` so.

        The caller then ``start``s the thread if it has not run yet (tests drive ``settle``
        directly instead).  A keeper with nothing to settle that never started is done here,
        without a thread."""
        self._step = step
        self.result = SettleResult(ended)
        self._finish_requested = True
        if not self.started and step is None:
            self.started = True  # nothing to renew or settle: no thread at all
            self.finished_at = self.clock()
            self.done.set()
            return
        self._wake.put(None)

    def settle_here(self) -> SettleResult | None:
        """Apply the requested step on the calling thread, once; its result if the keeper
        is done, else None (main thread, for a keeper whose thread never started).

        For a backend that settles in a moment (SQLite, inside its ``quick_writes``) a
        short task's lease needs no thread at all: a thread hand-off per task was a good
        part of the supervisor's cost.  False -- busy, failed, or the deadline passed --
        leaves everything to the thread, which retries and logs as usual."""
        step = self._step
        if self.started or step is None or self.lost():
            return None
        return self._done_here(self._attempt(step))

    def settled_together(self, error: BaseException | None) -> SettleResult | None:
        """``settle_here`` for a step the backend applied together with others'
        (Backend.complete_many): ``error`` is what it raised for this lease, None when it
        went through (the completer thread, worker/completer.py, for a keeper whose thread
        never started and that nothing else touches meanwhile)."""
        if self.started or self._step is None:
            return None
        return self._done_here(None if error is None else self._outcome(error))

    def _done_here(self, error: Exception | None) -> SettleResult | None:
        """After a settlement off the keeper's own thread (main or completer): its result,
        or None when it is left to that thread, which retries and logs as usual (busy,
        failed, or a bug)."""
        if error is not None:
            return None
        self.started = True
        self.finished_at = self.clock()
        self.done.set()
        return self.result

    def join(self, timeout: float) -> bool:
        return self.done.wait(timeout)

    # -- keeper thread -------------------------------------------------------------------
    def lost(self) -> bool:
        return self.lock_lost.is_set() or self.clock() >= self.deadline

    def _lose(self, reason: str, loud: bool = True) -> None:
        """``loud=False``: a passed deadline, which the watchdog finds and logs itself as it
        acts on it -- one line per lost lease, not one from each thread."""
        if not self.lock_lost.is_set():
            self.lost_reason = reason
            self.lock_lost.set()
            log.log(logging.ERROR if loud else logging.DEBUG, "lock lost: %s", reason,
                    extra={"task_id": self.task_id})
            if self._on_lost is not None:
                self._on_lost()

    def step(self) -> None:
        """One renewal attempt if one is due (keeper thread, or a test with a fake clock)."""
        now = self.clock()
        if self.lock_lost.is_set() or now < self.next_renew:
            return
        left = self.deadline - now
        if left <= 0:
            self._lose(f"deadline passed {-left:.1f}s ago without a successful renewal",
                       loud=False)
            return
        timeout = min(left, MAX_CALL_TIMEOUT)
        t_sent = now
        self.call_started, self.call_timeout = now, timeout
        try:
            granted = self.lease.renew(timeout)
        except LeaseLost as exc:
            self._lose(f"broker says the lease is gone: {exc}")
            return
        except Exception as exc:  # BackendError; anything else is a client library's bug
            self._renewed(t_sent, ok=False)
            self.failures += 1
            self.next_renew = self.clock() + min(self.renew_interval, RETRY_AFTER_FAILURE)
            log.warning("lease renewal failed (%.1fs left before the kill deadline): %s",
                        max(0.0, self.deadline - self.clock()), exc,
                        exc_info=not isinstance(exc, BackendError),
                        extra={"task_id": self.task_id})
            return
        finally:
            self.call_started = None
        self._granted(t_sent, granted)
        if log.isEnabledFor(logging.DEBUG):
            until = datetime.now(timezone.utc) + timedelta(seconds=granted)
            log.debug("Lock renewed till %s", until.strftime("%Y-%m-%dT%H:%M:%SZ"),
                      extra={"task_id": self.task_id})

    def _granted(self, t_sent: float, granted: float) -> None:
        """A renewal sent at ``t_sent`` got ``granted`` seconds (keeper thread)."""
        self._renewed(t_sent, ok=True)
        self.renewals += 1
        self.granted = granted
        self.deadline = lease_deadline(t_sent, granted)
        self.expires = t_sent + granted
        # A broker may grant less than asked: renew well before this grant runs out.
        self.next_renew = next_renewal(t_sent, granted, self.renew_interval)

    def _renewed(self, t_sent: float, ok: bool) -> None:
        if self._on_renewal is not None:
            self._on_renewal(self.clock() - t_sent, ok)

    def healthy(self, now: float, grace: float = 5.0) -> bool:
        """False when this thread is stuck: a call ran past its own timeout, or a due renewal
        did not start (read by the main thread for the systemd watchdog)."""
        if self.done.is_set() or self._finish_requested or self.lock_lost.is_set():
            return True
        started = self.call_started
        if started is not None:
            return now <= started + self.call_timeout + grace
        return now <= self.next_renew + grace

    def settle(self) -> None:
        """Apply the requested step unless the lease is lost (keeper thread).

        A failed call is retried while the lease lasts: after 1 s, then twice as long each
        time up to SETTLE_RETRY_MAX, but never past the last try, SETTLE_LAST_TRY before the
        deadline (``settle_retry_at``).  While it waits, the lease is renewed when due, so a
        service that answers again extends it and the settlement is tried at once."""
        step = self._step
        if step is None:
            return
        wait = 1.0
        error: Exception | None = None
        while True:
            if self.lost():
                self._not_settled(error)
                return
            error = self._attempt(step)
            if error is None:
                return
            retry_at = settle_retry_at(self.clock(), wait, self.deadline)
            if retry_at is None:  # that was the last try before the deadline
                self._not_settled(error)
                return
            log.warning("settlement failed, retrying in %.0fs: %s",
                        max(0.0, retry_at - self.clock()), error,
                        exc_info=not isinstance(error, BackendError),
                        extra={"task_id": self.task_id})
            if self._wait_renewing(retry_at) == "gone":
                # The broker says the lease is gone -- perhaps because the call that failed
                # was applied all the same: the backend tells that apart on one more try.
                if self._attempt(step) is not None:
                    self._lose(self._gone)
                    self._not_settled(None)
                return
            wait = min(wait * 2, SETTLE_RETRY_MAX)

    def _wait_renewing(self, until: float) -> str:
        """Wait for a settlement retry at ``until``, renewing the lease when a renewal is
        due (keeper thread).  "renewed": the service answered, retry now; "gone": the broker
        says the lease is gone; "" at ``until`` or the deadline."""
        while not self.lost():
            now = self.clock()
            if now >= until:
                return ""
            budget = min(until - now, RENEW_WHILE_SETTLING)
            due = now >= self.next_renew
            if due and budget >= MIN_RENEW_CALL:
                outcome = self._renew_once(budget)
                if outcome:
                    return outcome
                continue
            self._retry_sleep(max(0.0, (until if due else min(until, self.next_renew)) - now))
        return ""

    def _renew_once(self, timeout: float) -> str:
        """One renewal while a settlement waits: "renewed", "gone" or "" (failed; keeper
        thread).  Unlike ``step``, "gone" does not end the lease: the settlement decides."""
        t_sent = self.clock()
        self.call_started, self.call_timeout = t_sent, timeout
        try:
            granted = self.lease.renew(timeout)
        except LeaseLost as exc:
            self._gone = f"broker says the lease is gone: {exc}"
            return "gone"
        except Exception as exc:  # BackendError; anything else is a client library's bug
            self._renewed(t_sent, ok=False)
            self.failures += 1
            self.next_renew = self.clock() + min(self.renew_interval, RETRY_AFTER_FAILURE)
            log.debug("lease renewal while settling failed: %s", exc,
                      exc_info=not isinstance(exc, BackendError),
                      extra={"task_id": self.task_id})
            return ""
        finally:
            self.call_started = None
        self._granted(t_sent, granted)
        return "renewed"

    def _not_settled(self, error: Exception | None) -> None:
        """The settlement did not happen and will not (keeper thread): say why, truthfully --
        ``error`` is the last failed call's, None when it was never tried or refused."""
        if self.result is not None and self.result.refused:
            return  # _attempt said so already: the broker refused it (LeaseLost)
        if error is not None:
            reason = self._unsettle(Unsettled.UNREACHABLE, (
                f"could not settle: the service was unreachable until the lease ended ({error})"))
        else:
            reason = self._unsettle(Unsettled.LEASE_LOST, (
                f"not settled: the lease was lost ({self.lost_reason})" if self.lost_reason
                else "not settled: the lease deadline passed before the settlement could be "
                     "tried"))
        log.warning("%s; %s", reason, self.comes_back, extra={"task_id": self.task_id})

    def _unsettle(self, why: Unsettled, reason: str) -> str:
        """The settlement will not happen, ``why`` in ``reason`` (keeper thread, or the main
        thread in ``settle_here``); returns ``reason``."""
        assert self.result is not None  # set by ``finish``, before any settlement
        self.result = SettleResult(self.result.ended, why, reason)
        return reason

    def _attempt(self, step: SettleStep) -> Exception | None:
        """One settlement call: None when it is over (done, or refused: the lease is lost),
        else the error to retry after (``settle`` and ``settle_here``)."""
        try:
            step.apply(self.lease)
        except Exception as exc:  # BackendError; or a client library's bug, retried too:
            # a race in the Storage Queue SDK's model cache raised RuntimeError here once
            # and, uncaught, left the message unsettled until its lock ran out
            return self._outcome(exc)
        return None

    def _outcome(self, exc: BaseException) -> Exception | None:
        """What a settlement call that raised ``exc`` leaves: a LeaseLost is the end (the
        lease is lost, the settlement refused: None); anything else the error to retry
        after (an Exception that is not one is raised again)."""
        if isinstance(exc, LeaseLost):
            self._lose(f"broker refused the settlement: {exc}")
            self._unsettle(Unsettled.REFUSED, f"the broker refused the settlement: {exc}")
            return None
        if not isinstance(exc, Exception):
            raise exc
        return exc

    def _sleep(self, timeout: float | None) -> None:
        """Until ``finish`` wakes us or ``timeout`` passes (keeper thread)."""
        try:
            self._wake.get(timeout=timeout)
        except queue.Empty:
            pass

    def _run(self) -> None:
        try:
            while not self._finish_requested:
                if self.lock_lost.is_set():
                    self._sleep(None)
                else:
                    self._sleep(max(0.0, self.next_renew - self.clock()))
                if self._finish_requested:
                    break
                self.step()
            self.settle()
        finally:
            self.finished_at = self.clock()
            self.done.set()
