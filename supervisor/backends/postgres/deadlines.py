"""Client-side deadlines for the lease threads' statements.

A server that hangs -- SIGSTOPped, a host stalled in swap, a link a middlebox black-holes --
keeps accepting and acknowledging bytes while nothing answers: the statement_timeout the
server would enforce never fires, libpq's tcp_user_timeout neither, and psycopg waits for
ever.  A renewal must give up within the time it was given (base.Lease.renew), so each one
runs ``within`` its deadline: the connection it uses (the pool's check of it included, see
``check``) is registered while the call lasts, and one watcher thread shuts the socket of a
call still running at its deadline down.  The call then fails at once (a psycopg
OperationalError: a BackendError for the keeper, which retries while the lease lasts) and
the pool discards the broken connection.

Threads: ``within``, ``bounded`` and ``check`` on the lease threads (and the main thread's and
the wake-up listener's calls); ``_watch`` on the watcher, started through core/threads.py with
the first bounded call and ended by its stop Event, which ``stop`` sets when a backend's pools
close (a later call starts another).  While calls come it looks every TICK at least; after a
TICK in which no call began it parks -- waits for the next call's wake-up with no timeout --
so an idle worker's watcher costs nothing.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from ...core.threads import start_thread

TICK = 0.25  # s: the watcher looks at least this often while calls come
STOP_WAIT = 2.0  # s ``stop`` waits for the watcher to end

# A connection as we open them: rows come back as tuples.
Conn = psycopg.Connection[TupleRow]


class CallDeadlines:
    """The calls in flight and their deadlines (one for the process: ``DEADLINES``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[float, Conn]] = {}
        self._cut: set[int] = set()
        self._keys = itertools.count()
        self._wake = threading.Event()
        # When the watcher looks next (monotonic).  A call whose deadline is later needs no
        # wake-up (Event.set and a thread switch per statement cost the per-task path): the
        # watcher looks at least every TICK, and calls carry bounds of a second and more.
        self._armed = float("inf")
        self._begun = 0  # calls begun so far: none since the watcher's last look -> it parks
        self._stop = threading.Event()  # the running watcher's: set by ``stop``
        self._watcher: threading.Thread | None = None
        self._local = threading.local()
        # The pool's check of a connection before lending it costs a round trip: it is made
        # only after a call failed (a server restart leaves every idle connection dead),
        # once per connection lent since (``suspect``, ``check``).
        self._failures = 0
        self._checked: weakref.WeakKeyDictionary[Conn, int] = \
            weakref.WeakKeyDictionary()

    @property
    def watcher(self) -> threading.Thread | None:
        """The watcher thread while one runs (tests)."""
        return self._watcher

    @contextmanager
    def within(self, deadline: float) -> Iterator[None]:
        """The calling thread's ``bounded`` calls in the block end by ``deadline``
        (time.monotonic())."""
        self._local.deadline = deadline
        try:
            yield
        finally:
            self._local.deadline = None

    @contextmanager
    def bounded(self, conn: Conn) -> Iterator[None]:
        """Calls on ``conn`` in the block are cut at the calling thread's deadline
        (``within``; none: not bounded).  A cut call raises OperationalError saying so."""
        deadline = getattr(self._local, "deadline", None)
        if deadline is None:
            yield
            return
        key = next(self._keys)
        with self._lock:
            self._calls[key] = (deadline, conn)
            self._begun += 1
            if self._watcher is None:
                stop = self._stop = threading.Event()
                self._armed = float("inf")
                self._watcher = start_thread(lambda: self._watch(stop), "jobq-pg-deadlines")
            wake = deadline < self._armed
            if wake:
                self._armed = deadline
        if wake:
            self._wake.set()
        try:
            yield
        except psycopg.OperationalError:
            with self._lock:
                cut = key in self._cut
            if cut:
                raise psycopg.OperationalError(
                    "no answer from the server in time (it hangs, or the link does)") from None
            raise
        finally:
            with self._lock:
                self._calls.pop(key, None)
                self._cut.discard(key)

    def suspect(self) -> None:
        """A call failed: check every pooled connection once before it is lent again (the
        failed call's thread)."""
        with self._lock:
            self._failures += 1

    def check(self, conn: Conn) -> None:
        """The lease pool's check of a connection before lending it, bounded like the call
        that asked for it (that call's thread).  Only a connection not checked since the last
        failed call (``suspect``) is checked: a round trip before every settlement and renewal
        was a good part of a short task's cost, and a connection that broke on its own
        fails its call, which is retried on a checked one."""
        failures = self._failures
        if self._checked.get(conn, 0) >= failures:
            return
        with self.bounded(conn):
            ConnectionPool.check_connection(conn)
        self._checked[conn] = failures

    def _watch(self, stop: threading.Event) -> None:
        """Watcher thread: cut the calls past their deadline; park when no call came for a
        TICK; end on ``stop`` once no call is in flight (a cut one still needs its cut)."""
        seen = -1
        while True:
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                for key, (deadline, conn) in self._calls.items():
                    if deadline <= now and key not in self._cut:
                        # Under the lock: the call cannot end and its connection go to
                        # another call before the cut.
                        self._cut.add(key)
                        _shutdown(conn)
                pending = [d for k, (d, _) in self._calls.items() if k not in self._cut]
                if not self._calls and stop.is_set():
                    self._watcher = None
                    return
                if self._calls or self._begun != seen:
                    # Calls come: look again in a TICK anyway, so that the next calls (bounds
                    # of a second and more) need not wake the watcher either.
                    self._armed = min(pending, default=now + TICK)
                else:
                    self._armed = float("inf")  # idle: the next call wakes the watcher
                seen = self._begun
                armed = self._armed
            # a call or ``stop`` after the clear above sets the event: no wake-up is lost
            self._wake.wait(None if armed == float("inf") else max(0.0, armed - now))

    def stop(self) -> None:
        """End the watcher once no call is in flight (a later call starts another); wait
        for it a moment (the thread that closes the pools)."""
        with self._lock:
            watcher = self._watcher
            self._stop.set()
        if watcher is None:
            return
        self._wake.set()
        watcher.join(STOP_WAIT)


def _shutdown(conn: Conn) -> None:
    """Shut ``conn``'s socket down both ways (its owner's blocked read returns at once)."""
    try:
        fd = os.dup(conn.fileno())
    except (OSError, psycopg.Error):
        return  # closed already
    try:
        with socket.socket(fileno=fd) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


DEADLINES = CallDeadlines()
