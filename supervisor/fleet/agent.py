"""The control thread: the one place where a worker talks to its control store.

One per worker, on its own thread (``start``), with its own store opened on that thread (on
Azure opening may do network calls).  Every control interval it polls (the queue's flag,
cancels newer than its cursor, its own commands); every heartbeat interval it upserts the
worker record; now and then it purges; on a clean exit it deletes the record.  A store that
pushes (control/base.py ``Watchable``: PostgreSQL's LISTEN/NOTIFY) wakes it when its queue's
records are written, and it polls at once: a cancel, pause, drain or stop takes effect in
well under a second instead of up to a control interval.  The interval's poll stays the
backstop (a push lost while the store's listener was down; a store that cannot push).

It never signals a process and never touches a lease.  A cancel for a running task becomes a
request on its ``RunningTask`` (``cancel``) and a wake-up of the watchdog, exactly like a lock
loss; a pause flag or a drain/stop command is handed to the worker's ``on_paused`` /
``on_command``, which put it on the main loop's queue (callbacks: the fleet layer never
imports the worker).  Cancels seen are kept in ``cancels`` (task id -> Cancel), which the
launcher reads at claim time with a dict lookup: no store call on the main thread, ever.

Result records of attempts (worker/settlement.py) wait in an ``Outbox`` and are written in batches,
one store call each.  A store that is slow, down or black-holed only delays this thread:
each failure backs off (doubling, up to BACKOFF_MAX), is logged at most once a minute, and
the recovery once, by the first store call that answers again (core/backoff.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import socket
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Protocol, Union

from .. import __version__
from ..core.backoff import Outage
from ..core.signing import SigningKey
from ..core.threads import start_thread
from .control.base import (
    ControlConfigError,
    ControlStore,
    ControlStoreError,
    OnceLog,
    Watch,
    Watchable,
)
from .control.records import CMD_CHARS, Cancel, Command, ResultRecord, TaskInfo, WorkerRecord
from .control.signing import Gate
from .control.unique import release_final
from .outbox import LIVE_RESULT_DELAY, Outbox

if TYPE_CHECKING:
    from ..core.settings import Settings
    from ..core.task import Task

log = logging.getLogger("jobq.control")


class _Process(Protocol):
    @property
    def pid(self) -> int: ...


class _Keeper(Protocol):
    @property
    def expires(self) -> float: ...  # monotonic time the lease may be handed out again


class RunningTaskView(Protocol):
    """What the control thread reads of a worker's running task (the worker's RunningTask),
    and ``cancel``, which it sets once."""

    cancel: Union[Cancel, None]
    # Fields of the worker's RunningTask dataclass as they are (the main thread writes
    # ``exited_at``); the properties below are narrower views of its fields' types.
    task_id: str
    attempt: int
    task: Union[Task, None]
    started: float
    exited_at: Union[float, None]

    @property
    def lease(self) -> object: ...
    @property
    def proc(self) -> _Process: ...
    @property
    def keeper(self) -> _Keeper: ...


# (state, tasks, slots total, outcome counts): what the worker record shows (ControlAgent)
View = tuple[str, Sequence[RunningTaskView], int, dict[str, int]]

BACKOFF_MAX = 60.0
LOG_EVERY = 60.0  # an outage is logged at most this often
PURGE_EVERY = 3600.0
# Every this often a poll starts over (cursor None: every live cancel) and the local cache is
# replaced by its answer: a cancel deleted from the store (a task requeued after it) stops
# applying here within a minute.  It costs no extra call, only a bigger answer.
REFRESH_EVERY = 60.0
FIRST_POLL_WAIT = 2.0  # the main loop waits this long at most for the first poll
STOP_BUDGET = 5.0  # the final record deletion may take this long at exit


class ControlAgent:
    """The control thread and what it shares.  ``start``/``stop``/``wait_first_poll``/
    ``acted``/``result`` are called from the main thread; ``paused`` and ``cancels`` are
    written by the control thread only and read anywhere.

    ``view`` returns (state, tasks, slots total, outcome counts) for the heartbeat: state is one of
    records.WORKER_STATES, tasks a snapshot (a tuple) of the worker's running tasks, never
    mutated here except for setting ``cancel`` once on a task."""

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
        self.on_paused = on_paused  # the queue's pause flag changed (control thread)
        self.on_command = on_command  # a drain/stop command for this worker (control thread)
        self.wake_watchdog = wake_watchdog
        self.view = view
        self.gate = Gate(keys)
        self.heartbeat_interval = heartbeat_interval
        self.control_interval = control_interval
        self.clock = clock
        self.wall = wall
        self.started_wall = wall()
        self.host = socket.gethostname()
        self.paused = False
        self.cancels: dict[str, Cancel] = {}
        self.first_poll = threading.Event()
        self.store: Union[ControlStore, None] = None
        self.watch: Union[Watch, None] = None  # the store's push, if it has one
        self._cursor: Union[str, None] = None
        self._next_refresh = -math.inf
        self._next_poll = self._next_beat = -math.inf  # (set by _loop)
        self._next_purge = math.inf
        self._seen_commands: set[str] = set()
        self._acted: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.outbox = Outbox(clock)  # result records not written yet
        self._drops_logged = 0
        self._drops_logged_at = -math.inf
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self.beat_now = False  # the state changed: upsert the record without waiting
        self._clean_exit = False
        self.outage = Outage("control store", log, clock, backoff_max=BACKOFF_MAX,
                             log_every=LOG_EVERY, repeat=True,
                             effect="tasks, leases and settlements are not affected")
        self._once = OnceLog()
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
        self._acted.put(command)
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
        self._report_drops()
        # ... or until the next cancel expires: the launcher reads the cache as it is
        due = min(self._next_poll, self._next_beat, self._next_purge, self.outbox.due())
        return max(0.0, min(due - self.clock(), self._expire() - self.wall()))

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
        called = False
        while True:
            try:
                command = self._acted.get_nowait()
            except queue.Empty:
                return called
            try:
                self.store.ack_command(command)
            except ControlStoreError:
                self._acted.put(command)  # next time
                raise
            called = True
            self.beat_now = True  # a drain or stop changed the worker's state

    def _write_results(self) -> bool:
        """Every waiting result record in one store call; whether one was made (control
        thread)."""
        assert self.store is not None
        batch = self.outbox.batch()
        if not batch:
            return False
        self.store.put_results(list(batch.values()))
        self.outbox.written(batch)
        release_final(self.store, batch.values())
        return True

    def _report_drops(self) -> None:
        dropped, now = self.outbox.dropped, self.clock()
        if dropped > self._drops_logged and now - self._drops_logged_at >= LOG_EVERY:
            log.warning("control store: %d result record(s) dropped so far: the store could "
                        "not take them and %d were waiting (their tasks ran and were settled "
                        "as usual)", dropped, self.outbox.kept)
            self._drops_logged, self._drops_logged_at = dropped, now

    def _poll(self) -> None:
        assert self.store is not None
        refresh = self.clock() >= self._next_refresh
        snap = self.store.poll(self.queue, self.worker_id, None if refresh else self._cursor)
        self._cursor = snap.cursor
        wall = self.wall()
        live = {c.task_id: c for c in self.gate.filter(list(snap.cancels))
                if c.queue == self.queue and c.expires() > wall}
        if refresh:  # in place: the launcher holds this very dict
            for task_id in [t for t in self.cancels if t not in live]:
                self.cancels.pop(task_id, None)
            self._next_refresh = self.clock() + REFRESH_EVERY
        self.cancels.update(live)
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
            self.beat_now = True
        for command in self.gate.filter(list(snap.commands)):
            self._command(command)
        self._apply_cancels()
        self.first_poll.set()

    def _command(self, command: Command) -> None:
        if command.worker != self.worker_id or command.seq in self._seen_commands:
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
        self._expire()
        if not self.cancels:
            return
        woke = False
        for rt in self.view()[1]:
            cancel = self.cancels.get(rt.task_id)
            if cancel is not None and rt.cancel is None and rt.exited_at is None:
                rt.cancel = cancel
                log.warning("cancelled by %s: %s (grace %gs)", cancel.who,
                            cancel.reason or "no reason given", cancel.grace,
                            extra={"task_id": rt.task_id})
                woke = True
        if woke:
            self.wake_watchdog()

    def _heartbeat(self) -> None:
        assert self.store is not None
        self.store.put_worker(self.record())

    def record(self) -> WorkerRecord:
        """The worker record as of now (control thread)."""
        state, tasks, slots, counts = self.view()
        mono, wall = self.clock(), self.wall()
        infos = []
        for rt in tasks:
            if rt.exited_at is not None:
                continue
            cmd = rt.task.cmd if rt.task is not None else ""
            names = tuple(sorted(rt.task.env)) if rt.task is not None else ()
            infos.append(TaskInfo(id=rt.task_id, attempt=rt.attempt, pid=rt.proc.pid,
                                  started=wall - (mono - rt.started),
                                  lease_expires=wall + rt.keeper.expires - mono,
                                  cmd=cmd[:CMD_CHARS], env_names=names))
        if state == "running" and self.paused:
            state = "paused"
        return WorkerRecord(id=self.worker_id, queue=self.queue, host=self.host,
                            pid=os.getpid(), version=__version__, state=state,
                            slots_used=len(infos), slots_total=slots,
                            started=self.started_wall, heartbeat=wall,
                            interval=self.heartbeat_interval, tasks=tuple(infos),
                            succeeded=counts.get("succeeded", 0),
                            failed=counts.get("failed", 0) + counts.get("dead_lettered", 0))

    def _purge(self) -> None:
        assert self.store is not None
        self.store.purge(self.wall())

    def _expire(self) -> float:
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
