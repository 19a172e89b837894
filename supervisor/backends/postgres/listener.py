"""Wake-ups of the PostgreSQL queue: LISTEN on the schema's ``"<schema>.wake"`` channel, so an
idle worker starts a pushed task at once instead of at its next poll (docs/backends.rst,
"PostgreSQL").

A push sends ``pg_notify('<schema>.wake', queue)`` in its own transaction (backend.py), so the
notification arrives when the tasks are committed.  One ``WakeListener`` per worker and
database (the queues of a worker share it: ``acquire``/``release``) holds a connection of its
own, outside the pools -- psycopg's ``Connection.notifies`` holds the connection's lock while it
waits -- and one thread, started through core/threads.py, that waits on that connection's
socket and a pipe (``close`` writes to it, so the thread ends at once).  A notification sets
the flag of its queue and wakes the idle main loop (``Backend.wake_with``: a WAKE on its event
queue, worker/loop.py), whose receive then asks the backend's ``changed()`` probe, which takes
the flag.  The poll stays the backstop: a flag only brings a receive forward.

A connection that breaks (a server restart, a failover, a cut link) is opened and LISTENed
again with back-off (core/backoff.py), and every flag is set once it is: a NOTIFY sent while
it was down was lost.  A link that goes silent without breaking is found by a ``SELECT 1``
after ``PING_EVERY`` seconds without traffic, which must answer within ``PING_TIMEOUT``: a
client-side deadline (deadlines.py), as the LISTEN after a connect has -- a frozen server
(SIGSTOP, a host stalled in swap) keeps acknowledging at the TCP level, so neither the TCP
user timeout nor keepalives would ever break that call.  While it is down, the probe says
"nothing new": the worker polls, as with ``--postgres-notify off``.

The control store (fleet/control/postgres.py) runs a ``WakeListener`` of its own on
``"<schema>.control"``: the same thread, reconnection and deadlines, another channel, its own
connection (``name``/``effect``/``thread_name`` tell its log lines and thread apart).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Hashable, Iterable

from ...core.backoff import Outage
from ...core.settings import Settings
from ...core.threads import start_thread
from ..base import BackendError
from .connect import APP_WORKER, connect, conninfo, one_line, psycopg
from .deadlines import DEADLINES
from .schema import wake_channel

log = logging.getLogger("jobq.postgres")

PING_EVERY = 30.0  # s without traffic before the listener checks that its link is alive
PING_TIMEOUT = 10.0  # s the SELECT 1 (and the LISTEN after a connect) may take
STOP_WAIT = 2.0  # s ``close`` waits for the thread to end (it is a daemon thread anyway)
OUTAGE_EFFECT = "tasks start at the next poll meanwhile"


def quoted(name: str) -> str:
    """An SQL identifier, quoted (``LISTEN`` takes no parameter)."""
    return '"' + name.replace('"', '""') + '"'


class WakeListener:
    """LISTEN on ``channel`` through connections made by ``connect`` (autocommit is set here).

    ``watch``/``changed``/``close``: the main thread; the listening itself: the listener's own
    thread, from ``start`` until ``close``."""

    def __init__(self, connect: Callable[[], psycopg.Connection], channel: str,
                 clock: Callable[[], float] = time.monotonic,
                 describe: Callable[[BaseException], str] = str, *,
                 ping_every: float = PING_EVERY, ping_timeout: float = PING_TIMEOUT,
                 name: str = "PostgreSQL wake-up listener", effect: str = OUTAGE_EFFECT,
                 thread_name: str = "pg-wake-listener",
                 key: Callable[[str], str] = str) -> None:
        """``connect``: a new connection, or BackendError / psycopg.Error; ``describe``: an
        error as one line for the log, without secrets (connect.py: ``one_line``).
        ``name``/``effect``/``thread_name``: what its outage lines and its thread are called
        (the control store's listener, fleet/control/postgres.py, is another one).  ``key``:
        the watched name a payload stands for (the output store's listener,
        fleet/output/postgres.py, watches tasks, its payloads name attempts)."""
        self.connect = connect
        self.ping_every = ping_every
        self.ping_timeout = ping_timeout
        self.channel = channel
        self.clock = clock
        self.describe = describe
        self.key = key
        self._queues: set[str] = set()  # whose notifications are kept
        self._changed: set[str] = set()  # notified since the main thread last asked
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._pipe_open = True
        self._outage = Outage(name, log, clock, backoff_min=0.5,
                              backoff_max=10.0, effect=effect,
                              recovery="%(store)s listening again after %(failures)d failed "
                                       "call(s)")
        self._thread: threading.Thread | None = None
        self.thread_name = thread_name
        # called (on this thread) after a watched queue's flag was set: the worker's main
        # loop looks at once (Backend.wake_with)
        self.wake: Callable[[], None] = lambda: None
        self.listening = threading.Event()  # set while LISTEN holds (tests wait on it)
        self.connects = 0  # LISTENs done so far (tests: it reconnected)

    # -- the main thread ---------------------------------------------------------------
    def watch(self, queue: str) -> None:
        """Keep ``queue``'s notifications from now on; its flag starts set."""
        with self._lock:
            self._queues.add(queue)
            self._changed.add(queue)

    def unwatch(self, queue: str) -> None:
        with self._lock:
            self._queues.discard(queue)
            self._changed.discard(queue)

    def changed(self, queue: str) -> bool:
        """True (once) when ``queue`` was notified, or the listener (re)connected, since the
        last call for it."""
        with self._lock:
            if queue not in self._changed:
                return False
            self._changed.discard(queue)
            return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = start_thread(self._run, self.thread_name)

    def close(self) -> None:
        """Stop the thread (it closes its connection) and wait a moment for it."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self._lock:
            if self._pipe_open:
                try:
                    os.write(self._wake_w, b"x")
                except OSError:  # the pipe is full: the thread is being woken already
                    pass
        if self._thread is None:
            self._close_pipe()
        elif self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT)  # it closes the pipe as it ends

    def _close_pipe(self) -> None:
        """Once, by whoever ends last: the thread as it ends, or ``close`` without one."""
        with self._lock:
            if self._pipe_open:
                self._pipe_open = False
                os.close(self._wake_r)
                os.close(self._wake_w)

    # -- the listener thread -----------------------------------------------------------
    def _mark(self, queues: Iterable[str] | None) -> None:
        """Set the flags of ``queues`` (None: of every watched queue) and wake the worker
        when one of them was not set yet: a busy worker, which asks no probe until a slot
        is free, is woken once, not at every push."""
        with self._lock:
            marked = self._queues if queues is None else self._queues.intersection(queues)
            new = marked - self._changed
            self._changed |= new
        if new:
            self.wake()

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        try:
            while not self._stop.is_set():
                if conn is None:
                    conn = self._open()
                    if conn is None:
                        self._stop.wait(max(0.0, self._outage.retry_at - self.clock()))
                        continue
                try:
                    self._listen_on(conn)
                except (psycopg.Error, OSError, BackendError) as exc:
                    self.listening.clear()
                    if not self._stop.is_set():
                        self._outage.failed("wait", self.describe(exc))
                    _close_quietly(conn)
                    conn = None
                    self._stop.wait(max(0.0, self._outage.retry_at - self.clock()))
        finally:
            self.listening.clear()
            if conn is not None:
                _close_quietly(conn)
            self._close_pipe()

    def _open(self) -> psycopg.Connection | None:
        """A connection that LISTENs, or None after a failure (logged, back-off set)."""
        conn = None
        try:
            conn = self.connect()
            conn.autocommit = True
            self._bounded(conn, f"LISTEN {quoted(self.channel)}")
        except (psycopg.Error, OSError, BackendError) as exc:
            if conn is not None:
                _close_quietly(conn)
            self._outage.failed("listen", self.describe(exc))
            return None
        self._outage.succeeded()
        self.connects += 1
        self.listening.set()
        self._mark(None)  # a NOTIFY may have come while we were not listening
        return conn

    def _listen_on(self, conn: psycopg.Connection) -> None:
        """Until stopped or the connection breaks (raises psycopg.Error)."""
        quiet_since = self.clock()
        while not self._stop.is_set():
            left = quiet_since + self.ping_every - self.clock()
            if left <= 0:
                self._bounded(conn, "SELECT 1")  # a silent link or a frozen server: cut
                quiet_since = self.clock()
                continue
            ready, _, _ = select.select([conn.pgconn.socket, self._wake_r], [], [], left)
            if not ready or self._stop.is_set():
                continue
            quiet_since = self.clock()
            # Readable: the notifications that came, or the server's goodbye -- then the
            # next read raises (the connection is closed).
            self._mark(self.key(n.payload) for n in conn.notifies(timeout=0))

    def _bounded(self, conn: psycopg.Connection, sql: str) -> None:
        """``sql`` on ``conn``, cut after ``ping_timeout`` seconds (deadlines.py: the socket
        is shut down, the call raises psycopg.OperationalError)."""
        with DEADLINES.within(time.monotonic() + self.ping_timeout), DEADLINES.bounded(conn):
            conn.execute(sql)


def _close_quietly(conn: psycopg.Connection) -> None:
    try:
        conn.close()
    except (psycopg.Error, OSError):
        pass


# -- one listener per worker and database --------------------------------------------------
_shared: dict[Hashable, tuple[WakeListener, set[str]]] = {}


def acquire(key: Hashable, queue: str, make: Callable[[], WakeListener]) -> WakeListener:
    """The listener of ``key`` (the database and channel), made and started by ``make`` for
    the first queue, now watching ``queue`` too (main thread: backends open there)."""
    if key not in _shared:
        listener = make()
        listener.start()
        _shared[key] = (listener, set())
    listener, queues = _shared[key]
    listener.watch(queue)
    queues.add(queue)
    return listener


def release(key: Hashable, queue: str) -> None:
    """``queue`` no longer listens; the last one closes the listener (main thread)."""
    entry = _shared.get(key)
    if entry is None:
        return
    listener, queues = entry
    listener.unwatch(queue)
    queues.discard(queue)
    if not queues:
        del _shared[key]
        listener.close()


class QueueWake:
    """One queue's share of its worker's listener: the backend's change probe (main
    thread)."""

    def __init__(self, key: Hashable, queue: str, make: Callable[[], WakeListener]) -> None:
        self.key = key
        self.queue = queue
        self.listener = acquire(key, queue, make)

    def changed(self) -> bool:
        return self.listener.changed(self.queue)

    def wake_with(self, wake: Callable[[], None]) -> None:
        self.listener.wake = wake

    def close(self) -> None:
        release(self.key, self.queue)


def queue_wake(settings: Settings) -> QueueWake | None:
    """The wake-ups of a worker's queue ``settings.queue``; None with ``--postgres-notify
    off`` (PgBouncer in transaction mode: no LISTEN, the worker polls).  ``jobq-ctl`` never
    listens: its caller asks only for a worker (main thread)."""
    if settings.postgres_notify != "on":
        return None
    url, channel = settings.postgres_url, wake_channel(settings.postgres_schema)
    return QueueWake(
        (conninfo(url, APP_WORKER), channel), settings.queue,
        lambda: WakeListener(lambda: connect(url, application_name=APP_WORKER), channel,
                             describe=lambda exc: one_line(exc, url)))
