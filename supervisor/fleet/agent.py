"""The control thread: the one place where a worker talks to its control store.

One per worker, on its own thread (``start``), with its own store opened on that thread (on
Azure opening may do network calls); this module is the thread and its schedule.  Every
control interval it polls (fleet/directives.py: the queue's flag, cancels newer than its
cursor, its own commands, and what is done with them); every heartbeat interval it upserts
the worker record (fleet/worker_record.py); now and then it purges; on a clean exit it
deletes the record.  A store that pushes (control/base.py ``Watchable``: PostgreSQL's
LISTEN/NOTIFY) wakes it when its queue's records are written, and it polls at once: a cancel,
pause, drain or stop takes effect in well under a second instead of up to a control interval.
The interval's poll stays the backstop (a push lost while the listener was down).

Result records of attempts (worker/settlement.py) wait in an ``Outbox`` and are written in
batches, one store call each.  A store that is slow, down or black-holed only delays this
thread: each failure backs off (doubling, up to BACKOFF_MAX), is logged at most once a
minute, and the recovery once, by the first store call that answers again (core/backoff.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Union

from ..core.backoff import Outage
from ..core.signing import SigningKey
from ..core.threads import start_thread
from .control.base import (
    ControlConfigError,
    ControlStore,
    ControlStoreError,
    Watch,
    Watchable,
)
from .control.records import Cancel, Command, ResultRecord, WorkerRecord
from .control.signing import Gate
from .directives import Directives
from .outbox import LIVE_RESULT_DELAY, Outbox
from .worker_record import Registration, View

if TYPE_CHECKING:
    from ..core.settings import Settings

log = logging.getLogger("jobq.control")

BACKOFF_MAX = 60.0
LOG_EVERY = 60.0  # an outage is logged at most this often
PURGE_EVERY = 3600.0
FIRST_POLL_WAIT = 2.0  # the main loop waits this long at most for the first poll
STOP_BUDGET = 5.0  # the final record deletion may take this long at exit


class ControlAgent:
    """The control thread and what it shares.  ``start``/``stop``/``wait_first_poll``/
    ``acted``/``result`` are called from the main thread; ``paused`` and ``cancels`` (the
    directives') are written by the control thread only and read anywhere.

    ``view`` returns (state, tasks, slots total, outcome counts) for the heartbeat
    (worker_record.View); its tasks are never mutated here except for setting ``cancel``
    once on a task (directives.py)."""

    def __init__(self, *, queue_name: str, worker_id: str,
                 opener: Callable[[], Union[ControlStore, None]],
                 on_paused: Callable[[bool], None], on_command: Callable[[Command], None],
                 wake_watchdog: Callable[[], None], view: Callable[[], View],
                 keys: Sequence[SigningKey] = (), heartbeat_interval: float = 15.0,
                 control_interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.queue = queue_name
        self.worker_id = worker_id
        self.opener = opener
        self.heartbeat_interval = heartbeat_interval
        self.control_interval = control_interval
        self.clock = clock
        self.wall = wall
        self.registration = Registration(queue_name, worker_id, heartbeat_interval, view,
                                         clock, wall)
        self.directives = Directives(
            queue_name=queue_name, worker_id=worker_id,
            started_wall=self.registration.started_wall, gate=Gate(keys),
            on_paused=on_paused, on_command=on_command, wake_watchdog=wake_watchdog,
            tasks=lambda: view()[1], clock=clock, wall=wall)
        self.cancels: dict[str, Cancel] = self.directives.cancels  # updated in place
        self.first_poll = threading.Event()
        self.store: Union[ControlStore, None] = None
        self.watch: Union[Watch, None] = None  # the store's push, if it has one
        self._next_poll = self._next_beat = -math.inf  # (set by _loop)
        self._next_purge = math.inf
        self.outbox = Outbox(clock)  # result records not written yet
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self.beat_now = False  # the state changed: upsert the record without waiting
        self._clean_exit = False
        self.outage = Outage("control store", log, clock, backoff_max=BACKOFF_MAX,
                             log_every=LOG_EVERY, repeat=True,
                             effect="tasks, leases and settlements are not affected")
        self._thread: Union[threading.Thread, None] = None

    @classmethod
    def for_worker(cls, settings: Settings, on_paused: Callable[[bool], None],
                   on_command: Callable[[Command], None],
                   wake_watchdog: Callable[[], None],
                   view: Callable[[], View],
                   keys: Sequence[SigningKey]) -> Union[ControlAgent, None]:
        """The worker's agent, or None with ``--control off`` (main thread).  Whether a store
        exists is found out on the control thread, which opens it."""
        if settings.control == "off":
            return None
        from .control.open import open_control_store

        return cls(queue_name=settings.queue, worker_id=settings.worker_id,
                   opener=lambda: open_control_store(settings, create=True),
                   on_paused=on_paused, on_command=on_command, wake_watchdog=wake_watchdog,
                   view=view, keys=keys,
                   heartbeat_interval=settings.heartbeat_interval,
                   control_interval=settings.control_interval)

    @property
    def paused(self) -> bool:
        """The queue's pause flag as last polled (written by the control thread)."""
        return self.directives.paused

    # -- main thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread = start_thread(self._run, "control")

    def wait_first_poll(self, timeout: float = FIRST_POLL_WAIT) -> bool:
        """Before the first receive: let the first poll bring the live cancels and the pause
        flag, but never wait longer than ``timeout`` (main thread)."""
        if self.first_poll.wait(timeout):
            return True
        log.warning("control store: no answer within %.0fs; starting without its cancels "
                    "and pause flag (they apply from the first poll that succeeds)", timeout)
        return False

    def acted(self, command: Command) -> None:
        """The main loop carried out ``command``: acknowledge it (main thread)."""
        self.directives.acted(command)
        self._wake.put(None)

    def result(self, record: ResultRecord) -> None:
        """Queue ``record`` for the next batch (fleet/outbox.py); never waits (main thread)."""
        if self.outbox.put(record):
            self._wake.put(None)

    def stop(self, clean: bool) -> None:
        """End the thread; ``clean``: delete the worker record (a clean exit) (main thread).
        Waits STOP_BUDGET at most: a black-holed store never holds up the exit."""
        self._clean_exit = clean
        self._stop.set()
        self._wake.put(None)
        if self._thread is not None:
            self._thread.join(STOP_BUDGET)

    # -- control thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._open():
                self._start_watch()
                self._loop()
        finally:
            self.first_poll.set()
            if self.watch is not None:
                self.watch.close()  # its thread and connection end with this one
            if self.store is not None:
                with contextlib.suppress(ControlStoreError):
                    self.store.close()

    def _open(self) -> bool:
        while not self._stop.is_set():
            try:
                self.store = self.opener()
            except ControlConfigError as exc:
                log.error("control store: %s; fleet control is off for this run", exc)
                return False
            except ControlStoreError as exc:
                self._sleep(self.outage.failed("open", exc))
                continue
            # Not a recovery yet: opening may make no call (the Azure client is lazy); the
            # loop's first call that answers ends the outage.
            return self.store is not None
        return False

    def _start_watch(self) -> None:
        """Let a store that can push wake this thread on writes to the queue (control
        thread)."""
        if isinstance(self.store, Watchable):
            try:
                self.watch = self.store.watch(self.queue, lambda: self._wake.put(None))
                if self.watch is not None:  # results are pushed to readers too: sooner
                    self.outbox.delay = LIVE_RESULT_DELAY
            except ControlStoreError as exc:
                log.warning("control store: cannot listen for its pushes (%s); polling every "
                            "%gs", exc, self.control_interval)

    def _pushed(self, now: float) -> bool:
        """The store pushed a write to the queue (or may have lost one): poll now -- unless
        in a back-off, which the flag then outlasts (control thread)."""
        return self.watch is not None and now >= self.outage.retry_at and self.watch.changed()

    def _loop(self) -> None:
        now = self.clock()
        self._next_poll = self._next_beat = now
        self._next_purge = now + PURGE_EVERY / 2
        while not self._stop.is_set():
            self._sleep(self._pass())
        self._finish()

    def _pass(self) -> float:
        """Do what is due; the seconds until the next pass at the latest (control thread)."""
        try:
            # Whether a store call answered in this pass: a pass woken by a finished task
            # may have nothing due and make none, which proves nothing about the store -- it
            # must neither declare an outage over nor reset its back-off.
            called = self._flush()
            now = self.clock()
            if now >= self.outbox.due():
                called = self._write_results() or called
            pushed = self._pushed(now)  # (taken even when the poll is due anyway)
            if now >= self._next_poll or pushed:
                self._poll()
                self._next_poll = now + self.control_interval
                called = True
            # (a state change is beaten at once, but not in a back-off)
            if now >= self._next_beat or (self.beat_now and now >= self.outage.retry_at):
                self.beat_now = False
                self._heartbeat()
                self._next_beat = now + self.heartbeat_interval
                called = True
            if now >= self._next_purge:
                self._purge()
                self._next_purge = now + PURGE_EVERY
                called = True
            if called:
                self.outage.succeeded()
        except Exception as exc:  # ControlStoreError; or a bug: the thread must live on
            if not isinstance(exc, ControlStoreError):
                log.exception("control thread: unexpected error")
            self._next_poll = max(self._next_poll,
                                  self.clock() + self.outage.failed("call", exc))
            self._next_beat = max(self._next_beat, self._next_poll)
            self.outbox.retry_at = self._next_poll
        self.outbox.report_drops(LOG_EVERY)
        # ... or until the next cancel expires: the launcher reads the cache as it is
        due = min(self._next_poll, self._next_beat, self._next_purge, self.outbox.due())
        return max(0.0, min(due - self.clock(), self.directives.expire() - self.wall()))

    def _finish(self) -> None:
        """At exit: acknowledge what was acted on, write results, delete the record."""
        assert self.store is not None
        try:
            self._flush()
            self._write_results()
            if self._clean_exit:
                self.store.delete_worker(self.queue, self.worker_id)
            else:
                self._heartbeat()
        except ControlStoreError as exc:
            log.warning("control store: could not update the worker record at exit: %s", exc)

    def _sleep(self, seconds: float) -> None:
        try:
            self._wake.get(timeout=seconds)
            while True:
                self._wake.get_nowait()
        except queue.Empty:
            pass

    def _flush(self) -> bool:
        """Acknowledge what the main loop acted on; whether a store call was made (control
        thread)."""
        assert self.store is not None
        if not self.directives.flush(self.store):
            return False
        self.beat_now = True  # a drain or stop changed the worker's state
        return True

    def _write_results(self) -> bool:
        assert self.store is not None
        return self.outbox.write(self.store)

    def _poll(self) -> None:
        assert self.store is not None
        if self.directives.poll(self.store):
            self.beat_now = True  # paused or resumed: shown at once
        self.first_poll.set()

    def _heartbeat(self) -> None:
        assert self.store is not None
        self.store.put_worker(self.record())

    def record(self) -> WorkerRecord:
        """The worker record as of now (control thread)."""
        return self.registration.record(self.paused)

    def _purge(self) -> None:
        assert self.store is not None
        self.store.purge(self.wall())
