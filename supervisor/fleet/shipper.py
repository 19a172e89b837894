"""The output-store thread: every attempt's output, from the pump's buffers into the store.

One thread per worker ("output-store") owns the OutputStore, opened on this thread through an
opener (on Azure opening may do network calls; the first task must never wait for it).  The
pump thread hands it each read with ``feed`` and an attempt's end with ``end``; both only take
a short lock around in-memory buffers, never a store call, so a slow, down or black-holed
store can never stall the pump that reads the tasks' pipes (a task blocked on a full pipe
would stop, and its lease with it).

Each attempt's buffer is swapped out under the lock and written without it: every
FLUSH_EVERY while a task prints (LIVE_FLUSH when the store pushes each write to its
readers; sooner once a buffer passes FLUSH_SIZE), in chunks of at
most CHUNK_MAX.  A chunk whose write raised stays in flight and is retried as the very same
bytes (the store keeps a retried chunk once: base.OutputStore.append).  While the store is
slow or down, output is held up to ``buffer_limit`` bytes for the whole worker; beyond it reads
are dropped and counted until the held bytes are down to half of it, and the first read taken
again is preceded by ``base.DROPPED`` with the count, at the place of the gap
(``DROPPED_FULL`` when the store said it had no room meanwhile: a full disk), and once the
store holds that marker one log line names the attempt and the count.  Each attempt
stores at most ``output_max`` bytes of what the task printed, then ``base.TRUNCATED`` once;
the rest is counted and ignored.  Failures back off, logged once per outage (core/backoff.py).  Old
output is purged soon after the store opens, then every PURGE_EVERY.  At exit the rest gets
STOP_BUDGET seconds; what is left then is counted in one line (and, when the store said it
is full, marked where each attempt's stored output stops if it has room for the marker), and
the exit goes on.

Runs: an attempt released without counting (preemption, a stop) runs again under the same
key, here or elsewhere.  Each run is its own ``_Attempt``, written after the last run's end;
its first write is preceded by the store's ``reopen`` and, after earlier output, by RERUN.

An attempt that printed nothing is not stored at all (no ``finish``): its result record says
how it ended.  Creating its files cost a SQLite worker 20-50 % of its rate of short tasks on
the 2-core bench VM (a file or directory creation there takes ~0.5 ms of CPU; opening an
existing file ~9 us), and writing nothing cost it nothing measurable.

See docs/architecture.rst, "Task output".
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Callable, Union

from ..core.backoff import Outage
from ..core.threads import start_thread
from .output import base
from .output.base import (
    AttemptKey,
    OutputConfigError,
    OutputStore,
    OutputStoreError,
    OutputStoreFull,
)

BACKOFF_MIN, BACKOFF_MAX = 1.0, 30.0

if TYPE_CHECKING:
    from ..core.settings import Settings

log = logging.getLogger("jobq.output")

FLUSH_EVERY = 1.0  # s between two writes of an attempt that prints (the issue asks <= 2 s)
# s between them when readers are pushed each write (PostgreSQL with NOTIFY): a line shows
# within ~0.1 s median instead of ~0.5 s; the thread then ticks 5 times a second
LIVE_FLUSH = 0.2
FLUSH_SIZE = 1 << 20  # a buffer this big is written without waiting for the next tick
CHUNK_MAX = 4 << 20  # bytes per store call
PURGE_FIRST = 5.0  # s after the store opened: not while the first tasks start
PURGE_EVERY = 3600.0
STOP_BUDGET = 5.0
SHIP_TURN = 1.0  # s one round of writes may take before the thread looks at the clock again
# s the thread waits before opening the store, unless output piles up or the worker stops:
# opening imports the store's SDK (~60 ms of CPU for the Blob SDK), which competed with the
# worker's first receive and task start for the GIL.  Output printed meanwhile is held.
OPEN_DELAY = 0.3

Opener = Callable[[], Union[OutputStore, None]]


class _Attempt:
    """One run of an attempt's buffers; every field but ``opened`` (the output-store
    thread's own) is guarded by the shipper's lock."""

    __slots__ = ("key", "pieces", "size", "inflight", "seen", "dropped", "dropped_full",
                 "capped", "ended", "opened", "put", "taken", "gaps")

    def __init__(self, key: AttemptKey) -> None:
        self.key = key
        self.pieces: collections.deque[bytes] = collections.deque()
        self.size = 0  # bytes in ``pieces``
        self.inflight: Union[bytes, None] = None  # taken for the store, not yet stored
        self.seen = 0  # bytes the task printed (what the cap counts)
        self.dropped = 0  # bytes dropped since the last marker
        self.dropped_full = False  # some of them while the store said it was full
        self.capped = False
        self.ended = False
        self.opened = False  # the store's reopen was called for this run
        self.put = 0  # bytes put into ``pieces`` so far, markers included
        self.taken = 0  # bytes of them taken for the store so far
        # (where its marker ends in the put bytes, bytes dropped, store full): logged once
        # the store took the marker
        self.gaps: collections.deque[tuple[int, int, bool]] = collections.deque()


class OutputShipper:
    """``feed``/``end`` are called by the pump thread; ``start``/``stop`` by the main thread;
    everything else runs on the output-store thread.  The counters (``bytes_stored``,
    ``bytes_dropped``, ``bytes_truncated``) may be read from any thread."""

    def __init__(self, opener: Opener, *, buffer_limit: int, output_max: int,
                 retention: float, where: str = "", clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 flush_every: float = FLUSH_EVERY) -> None:
        self.opener = opener
        self.flush_every = flush_every
        self.where = where  # the store, for the start-up line
        self.buffer_limit = buffer_limit
        self.output_max = output_max
        self.retention = retention
        self.clock = clock
        self.wall = wall
        self.store: Union[OutputStore, None] = None
        self.disabled = False  # no store for this run: feeds are ignored
        self.bytes_stored = 0
        self.bytes_dropped = 0
        self.bytes_truncated = 0
        self.marked_at_exit = 0  # attempts whose unstored rest got a marker at exit
        self._lock = threading.Lock()
        self._attempts: dict[AttemptKey, _Attempt] = {}
        self._closing: list[_Attempt] = []  # ended runs whose key runs again: stored first
        self._buffered = 0  # bytes held (pieces and in flight) over all attempts
        self._dropping = False
        # The last store call failed for want of room (OutputStoreFull).  Set by the
        # output-store thread, read by the pump under the lock: a stale read only words a
        # marker "unreachable" instead of "full".
        self._full = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stop_by = math.inf
        self._next_flush = -math.inf
        self._next_purge = math.inf
        self._outage = Outage(
            "output store", log, clock, backoff_min=BACKOFF_MIN, backoff_max=BACKOFF_MAX,
            effect=f"output is held up to {buffer_limit} bytes, then dropped with a marker; "
                   "tasks and leases are not affected")
        self._answered = 0  # store calls that answered: only they end an outage
        self._thread: Union[threading.Thread, None] = None

    @classmethod
    def for_worker(cls, settings: Settings) -> Union[OutputShipper, None]:
        """The worker's shipper, or None when output is not stored: ``--task-output local``
        or ``off``, or ``auto`` and no store for this queue (main thread).  The store is
        only described here (no SDK imported, nothing created, no call made); it is opened
        on the thread, where a connection string the SDK rejects disables it."""
        if settings.task_output in ("local", "off"):
            return None
        from .output.open import describe_output_store, open_output_store, pushes_output

        try:
            where = describe_output_store(settings)
        except OutputConfigError as exc:  # --task-output store exited at start already
            log.error("output store: %s; task output is not stored in this run", exc)
            return None
        if where is None:
            return None
        return cls(lambda: open_output_store(settings, create=True), where=where,
                   buffer_limit=settings.task_log_buffer, output_max=settings.task_output_max,
                   retention=settings.task_output_retention,
                   flush_every=LIVE_FLUSH if pushes_output(settings) else FLUSH_EVERY)

    # -- pump thread ---------------------------------------------------------------------
    def feed(self, key: AttemptKey, data: bytes) -> None:
        """Take a read of the attempt's output; never blocks on the store (pump thread)."""
        with self._lock:
            if self.disabled:
                return
            a = self._run_of(key)
            if a.capped:
                self.bytes_truncated += len(data)
                return
            room = self.output_max - a.seen
            over = len(data) > room
            if over:
                self.bytes_truncated += len(data) - room
                data = data[:room]
            a.seen += len(data)
            before = a.size
            if data:
                # Once dropping, taken again only below half the bound: one marker per gap,
                # not one per read that happens to fit (a lone newline).
                bound = self.buffer_limit // 2 if self._dropping else self.buffer_limit
                self._dropping = self._buffered + len(data) > bound
            if data and self._dropping:
                a.dropped += len(data)
                a.dropped_full = a.dropped_full or self._full
                self.bytes_dropped += len(data)
            elif data:
                self._mark_gap(a)
                self._put(a, data)
            if over:
                self._mark_gap(a)  # markers may pass the bound: a few dozen bytes each
                self._put(a, base.TRUNCATED.format(limit=self.output_max).encode())
                a.capped = True
            wake = before < FLUSH_SIZE <= a.size  # once per crossing: no busy wake-ups
        if wake:
            self._wake.set()

    def end(self, key: AttemptKey) -> None:
        """The attempt's output is over: store the rest, then mark it complete (pump
        thread)."""
        with self._lock:
            if self.disabled:
                return
            a = self._run_of(key)
            self._mark_gap(a)
            a.ended = True
        # No wake-up: the next tick (within flush_every) writes and finishes every attempt
        # that ended since, in one go -- a wake-up per short task cost the worker ~10 % of
        # its task rate in thread switches.

    def _run_of(self, key: AttemptKey) -> _Attempt:
        """The key's current run; a new one when the last has ended (lock held)."""
        a = self._attempts.get(key)
        if a is None or a.ended:
            if a is not None:  # runs again before its last run's end is stored
                self._closing.append(a)
            a = self._attempts[key] = _Attempt(key)
        return a

    def _mark_gap(self, a: _Attempt) -> None:
        if a.dropped:
            marker = base.DROPPED_FULL if a.dropped_full else base.DROPPED
            self._put(a, marker.format(n=a.dropped).encode())
            a.gaps.append((a.put, a.dropped, a.dropped_full))
            a.dropped = 0
            a.dropped_full = False

    def _put(self, a: _Attempt, data: bytes) -> None:
        a.pieces.append(data)
        a.size += len(data)
        a.put += len(data)
        self._buffered += len(data)

    # -- main thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread = start_thread(self._run, "output-store", bulk=True)

    def stop(self, budget: float = STOP_BUDGET) -> None:
        """Store what is left within ``budget`` seconds, then give up and say how much was
        lost: a black-holed store never holds up the exit longer (main thread)."""
        self._stop_by = self.clock() + budget
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(budget + 0.5)
        left = self.unstored()
        if left:
            log.warning("output store: %d byte(s) of task output not stored at exit (the "
                        "store did not take them within %.0fs)%s", left, budget,
                        f"; a marker says so where the stored output of {self.marked_at_exit} "
                        f"attempt(s) stops" if self.marked_at_exit else "")

    def unstored(self) -> int:
        """Bytes held or dropped and not yet marked (any thread)."""
        with self._lock:
            return self._buffered + sum(a.dropped for a in self._runs())

    def held(self) -> int:
        """Bytes held for the store now (any thread)."""
        with self._lock:
            return self._buffered

    # -- output-store thread -------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._wake.wait(OPEN_DELAY)
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    wait = self.tick()
                except Exception:  # a bug: the thread must live on, the pump depends on it
                    log.exception("output-store thread: unexpected error")
                    wait = BACKOFF_MAX
                if self.disabled:
                    return
                self._wake.wait(wait)
            self.drain()
        finally:
            if self.store is not None:
                with contextlib.suppress(OutputStoreError):
                    self.store.close()

    def tick(self) -> float:
        """Open the store if need be, write what is due, purge when due; the seconds until
        the next tick (output-store thread)."""
        now = self.clock()
        if now < self._outage.retry_at:
            return self._outage.retry_at - now
        if self.store is None and not self._open():
            return max(0.0, self._outage.retry_at - self.clock())
        due = now >= self._next_flush
        if due:
            self._next_flush = now + self.flush_every
        answered = self._answered
        try:
            self._ship(due)
            if self.clock() >= self._next_purge:
                self._next_purge = self.clock() + PURGE_EVERY
                self._purge()
        except OutputStoreError as exc:
            self._full = isinstance(exc, OutputStoreFull)
            self._outage.failed("write", exc)
            return max(0.0, self._outage.retry_at - self.clock())
        self._full = False
        if self._answered > answered:  # a pass with nothing to write proves nothing
            self._outage.succeeded()
        return max(0.0, min(self._next_flush, self._next_purge) - self.clock())

    def drain(self) -> None:
        """At exit: everything held, retried until the stop budget is spent (output-store
        thread)."""
        if self.store is None and self.held() and not self.disabled:
            self._open()  # stopped before its first tick opened it
        while self.store is not None and self.clock() < self._stop_by:
            answered = self._answered
            try:
                if not self._ship(True):
                    return
                if self._answered > answered:
                    self._outage.succeeded()
            except OutputStoreError as exc:
                self._full = isinstance(exc, OutputStoreFull)
                self._outage.failed("write", exc)
                pause = min(self._outage.backoff, self._stop_by - self.clock())
                if pause > 0:
                    threading.Event().wait(pause)  # the stop budget, not the stop flag
        if self.store is not None and self._full:
            self._mark_unstored(self.store)

    def _mark_unstored(self, store: OutputStore) -> None:
        """The stop budget is spent and the store is full: where each attempt's stored
        output stops, ``UNSTORED_AT_EXIT`` with the bytes that did not make it, if the store
        has room for that much (the last block of a file usually has) -- else a reader could
        not tell that the output is cut (output-store thread, at exit).  Only a store that
        said it is full: its calls fail at once, so this adds nothing to the exit's time."""
        with self._lock:
            runs = [(a, a.size + len(a.inflight or b"") + a.dropped) for a in self._runs()
                    if a.opened]
        for a, lost in runs:
            if not lost:
                continue
            try:
                store.append(a.key, base.UNSTORED_AT_EXIT.format(n=lost).encode())
                if a.ended:
                    store.finish(a.key)
            except OutputStoreError:
                continue
            self.marked_at_exit += 1

    def _open(self) -> bool:
        try:
            store = self.opener()
        except OutputConfigError as exc:
            log.error("output store: %s; task output is not stored in this run", exc)
            self._disable()
            return False
        except OutputStoreError as exc:
            self._outage.failed("open", exc)
            return False
        if store is None:  # --task-output auto and no store for this queue
            self._disable()
            return False
        self.store = store
        self._next_purge = self.clock() + PURGE_FIRST
        log.debug("output store open: %r", store)
        # Not a recovery yet: opening may make no call (an SDK client is built lazily).
        return True

    def _disable(self) -> None:
        with self._lock:
            self.disabled = True
            self._attempts.clear()
            self._closing.clear()
            self._buffered = 0

    def _ship(self, everything: bool) -> bool:
        """Write what is due: all held output with ``everything``, else the attempts whose
        buffer is big or whose output ended; then mark ended attempts complete.  Whether
        anything was left to do (output-store thread; raises OutputStoreError)."""
        store = self.store
        assert store is not None
        started, did = self.clock(), False
        while True:
            with self._lock:
                work = [a for a in self._runs(firsts=True) if a.inflight is not None or a.ended
                        or (a.size and (everything or a.size >= FLUSH_SIZE))]
                for a in work:
                    if a.inflight is None and a.size:
                        a.inflight = self._take(a)
            if not work:
                return did
            did = True
            for a in work:
                finished = False
                if a.inflight is not None:
                    if not a.opened:
                        self._reopen(store, a)
                    store.append(a.key, a.inflight)  # raises: a.inflight is retried as is
                    self._answered += 1
                    with self._lock:
                        self._buffered -= len(a.inflight)
                        self.bytes_stored += len(a.inflight)
                        a.inflight = None
                        finished = a.ended and not a.size
                        marked = self._stored_gaps(a)
                    for n, full in marked:
                        log.warning("[%s] output store: %d byte(s) of attempt %d's output were "
                                    "dropped while the store was %s; its stored output has a "
                                    "marker in their place", a.key.task_id, n, a.key.attempt,
                                    "full" if full else "unreachable or slow")
                elif a.ended:
                    with self._lock:
                        finished = not a.size
                if finished:
                    if a.seen:  # printed nothing: nothing stored (see the module's doc)
                        store.finish(a.key)
                        self._answered += 1
                    with self._lock:
                        if a in self._closing:
                            self._closing.remove(a)
                        elif self._attempts.get(a.key) is a:
                            del self._attempts[a.key]
            if self.clock() - started >= SHIP_TURN:
                return True  # a flood: let the caller look at the stop flag and the clock

    def _runs(self, firsts: bool = False) -> list[_Attempt]:
        """Every run held, oldest first; ``firsts``: only each key's oldest, the one to write
        now -- a later run's bytes wait until it is finished (lock held)."""
        runs = self._closing + list(self._attempts.values())
        return list({a.key: a for a in reversed(runs)}.values())[::-1] if firsts else runs

    def _reopen(self, store: OutputStore, a: _Attempt) -> None:
        """Before a run's first write: its output is live again; a run after earlier output
        (an uncounted release) starts with the RERUN marker, in its first chunk, so a retry
        writes it with the same bytes (output-store thread; raises OutputStoreError)."""
        if store.reopen(a.key):
            mark = base.RERUN.format(attempt=a.key.attempt).encode()
            with self._lock:
                assert a.inflight is not None
                a.inflight = mark + a.inflight
                self._buffered += len(mark)
        a.opened = True

    @staticmethod
    def _stored_gaps(a: _Attempt) -> list[tuple[int, bool]]:
        """(bytes dropped, store full) of each gap whose marker the store now holds (lock
        held)."""
        out = []
        while a.gaps and a.gaps[0][0] <= a.taken:
            _end, n, full = a.gaps.popleft()
            out.append((n, full))
        return out

    @staticmethod
    def _take(a: _Attempt) -> bytes:
        """Up to CHUNK_MAX bytes off the front of the attempt's buffer (lock held)."""
        out: list[bytes] = []
        n = 0
        while a.pieces and n < CHUNK_MAX:
            piece = a.pieces.popleft()
            if n + len(piece) > CHUNK_MAX:
                cut = CHUNK_MAX - n
                a.pieces.appendleft(piece[cut:])
                piece = piece[:cut]
            out.append(piece)
            n += len(piece)
        a.size -= n
        a.taken += n
        return b"".join(out)

    def _purge(self) -> None:
        assert self.store is not None
        deleted = self.store.purge(self.wall() - self.retention)
        self._answered += 1
        if deleted:
            log.info("output store: purged the output of %d attempt(s) older than %gs",
                     deleted, self.retention)
