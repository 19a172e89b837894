"""Open PeekLock receivers kept ready by one opener thread (Service Bus backend).

Why: a receiver that settles a message must be the one that received it (the SDK settles
on the receive link by delivery id), and SDK clients are not thread-safe (its README: "We do
not guarantee that ... ServiceBusReceiver [is] thread-safe ... ensure proper thread-safety
management using mechanisms like threading.Lock()"; a settlement, a renewal and a receive
each read the one connection until their answer comes).  So every receiver is a
``SharedReceiver``: each SDK call on it -- the main thread's receive of several messages,
the renewals and settlements of their keepers -- holds its lock.  A receive takes a ready
receiver whose lock is free and gives it back at once; the leases it made keep calling it.
A receiver whose receive failed, or one of whose leases was lost (the link may be what
failed; a lease lost by the sweep may still have a call hung on it), is retired: no receive
uses it again, and it is closed once its last lease is over.

Opening a connection (TLS, SASL, CBS, attach; ~0.5 s even on loopback) happens on the opener
thread only, never on the main thread: the SDK's SASL handshake reads without any timeout, so
a server that accepts TCP and then stays silent would hang the caller until the network comes
back.  Retired receivers are closed on the opener thread too (a close can take ~1 s on a dead
link).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from functools import partial
from typing import Callable, TypeVar

from azure.servicebus import ServiceBusReceiver

from ...core.threads import start_thread
from ..azure_common import Scrubber
from ..base import BackendConfigError, BackendError
from .errors import translate

LOG = logging.getLogger("supervisor.backends.servicebus_pool")  # pinned (layout move)
RETRY_MAX = 10.0  # s between failed opens, at most
BUSY_RECHECK = 0.005  # s: take looks again this soon when every ready receiver is busy
BUSY_GROWTH = 4  # receivers kept open grow up to this many times ``keep`` when all are busy
# s the exit waits for its receivers' closes: enough for the part that matters (the link's
# drain, which releases messages delivered on credit left by a short receive: ~0.2 s), not
# for the SDK's keep-alive thread that a close joins last (it sleeps in steps of 1 s).
EXIT_CLOSE_WAIT = 0.5
T = TypeVar("T")


class SharedReceiver:
    """One open receiver and the leases whose messages it received (thread-safe)."""

    def __init__(self, pool: ReceiverPool, receiver: ServiceBusReceiver) -> None:
        self.pool = pool
        self.receiver = receiver
        self.lock = threading.Lock()  # held around every SDK call on ``receiver``
        self._state = threading.Lock()
        self._holders: set[int] = set()  # id() of the leases not over yet
        self.retired = False  # no receive again; closed when the last lease is over
        self.credit_left = False  # a receive got fewer messages than it asked for
        self._closed = False

    def hold(self, lease: object) -> None:
        """Main thread, while it holds ``lock`` after a receive."""
        with self._state:
            self._holders.add(id(lease))

    def call(self, timeout: float, fn: Callable[[ServiceBusReceiver, float], T]) -> T:
        """``fn(receiver, seconds left)`` alone on the receiver, if the lock comes within
        ``timeout`` s, else BackendError, which the keeper retries (keeper threads)."""
        start = time.monotonic()
        if not self.lock.acquire(timeout=max(0.0, timeout)):
            raise BackendError(f"receiver busy for {timeout:.1f}s (calls of other leases)")
        try:
            return fn(self.receiver, max(0.05, timeout - (time.monotonic() - start)))
        finally:
            self.lock.release()

    def leave(self, lease: object, lost: bool) -> bool:
        """The lease is over (``lost``: without a settlement, which retires the receiver);
        True the first time (any thread)."""
        with self._state:
            if id(lease) not in self._holders:
                return False
            self._holders.discard(id(lease))
        if lost:
            self.retire()
        else:
            self._close_if_done()
        return True

    def retire(self, close: bool = True) -> bool:
        """No receive uses this receiver again; it is closed once no lease holds it (any
        thread).  True if that is now: closed here, or by the caller if not ``close``."""
        self.retired = True
        return self._close_if_done(close)

    def _close_if_done(self, close: bool = True) -> bool:
        with self._state:
            now = self.retired and not self._holders and not self._closed
            self._closed = self._closed or now
        if now and close:
            self.pool.discard(self.receiver)
        return now


class ReceiverPool:
    """Thread-safe.  ``take`` and ``give_back`` are called by the main thread, ``discard``
    by any."""

    def __init__(self, factory: Callable[[], ServiceBusReceiver], scrub: Scrubber) -> None:
        self._factory = factory  # makes an unopened receiver (opener thread only)
        self._scrub = scrub
        self._ready: collections.deque[SharedReceiver] = collections.deque()
        self._doomed: list[ServiceBusReceiver] = []
        self._want = 1  # receivers to keep open: ready ones and the one taken
        self._cap = 2  # receivers kept at most (more are retired)
        self._out = 0  # taken by the main thread, not given back yet
        self._cond = threading.Condition()
        self._stopped = False
        self._error: Exception | None = None  # the last open failure, until an open succeeds
        self._thread: threading.Thread | None = None
        self._opening = False  # the opener thread is opening a receiver

    def start(self, want: int, wait: float) -> None:
        """Start the opener thread and wait up to ``wait`` s for the first open receiver
        (raises like ``take``)."""
        shared = self.take(want, wait)
        shared.lock.release()
        self.give_back(shared, front=True)

    def take(self, keep: int, wait: float) -> SharedReceiver:
        """A ready receiver whose lock was free, returned with its lock held; waits up to
        ``wait`` s for one.  ``keep``: how many to keep open from now on.

        Raises BackendConfigError (bad credentials, no such queue) or BackendError when
        none is free in time."""
        with self._cond:
            self._want = max(keep, self._want)  # grown by contention below: kept
            self._cap = max(self._cap, self._want)
            if self._thread is None:
                self._thread = start_thread(self._run, "sb-opener")
            self._cond.notify_all()
            deadline = time.monotonic() + wait
            grown = False
            while True:
                for shared in list(self._ready):
                    if shared.retired:
                        self._ready.remove(shared)
                        self._cond.notify_all()  # the opener replaces it
                    elif shared.lock.acquire(blocking=False):
                        self._ready.remove(shared)
                        self._out += 1
                        return shared
                if isinstance(self._error, BackendConfigError):
                    raise self._error
                if self._stopped:
                    raise BackendError("receive: the backend is closed")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._error or BackendError(
                        f"receive: no connection to Service Bus ready after {wait:.1f}s")
                if self._ready and not grown and self._want < keep * BUSY_GROWTH:
                    # Keepers' calls hold every open one (a slow broker, many slots): open
                    # one more, kept from now on, so settling never holds up a receive.
                    grown = True
                    self._want += 1
                    self._cap = max(self._cap, self._want)
                    self._cond.notify_all()
                # Look again soon: a lock release does not notify us.
                self._cond.wait(min(left, BUSY_RECHECK) if self._ready else left)

    def give_back(self, shared: SharedReceiver, front: bool = False) -> None:
        """A receiver the main thread took, its lock released (main thread)."""
        with self._cond:
            self._out -= 1
            if self._stopped or shared.retired or len(self._ready) >= self._cap:
                retire = True
            else:
                retire = False
                if front:
                    self._ready.appendleft(shared)
                else:
                    self._ready.append(shared)
            self._cond.notify_all()
        if retire:
            shared.retire()

    def discard(self, receiver: ServiceBusReceiver) -> None:
        """Close ``receiver`` on the opener thread (or now, when there is none)."""
        with self._cond:
            if self._thread is not None and not self._stopped:
                self._doomed.append(receiver)
                self._cond.notify_all()
                return
        _close(receiver)

    def _run(self) -> None:
        delay = 0.0
        while True:
            with self._cond:
                while not self._stopped and not self._doomed and (
                        len(self._ready) + self._out >= self._want or delay > 0):
                    if delay > 0:
                        self._cond.wait(delay)
                        delay = 0.0
                    else:
                        self._cond.wait()
                stopped = self._stopped
                doomed, self._doomed = self._doomed, []
                need = not stopped and len(self._ready) + self._out < self._want
            for receiver in doomed:
                _close(receiver)
            if stopped:
                return
            if need:
                self._opening = True  # read by close without the lock: a hint
                try:
                    delay = self._open_one(delay)
                finally:
                    self._opening = False

    def _open_one(self, delay: float) -> float:
        """Open one receiver; returns the pause before the next attempt."""
        receiver = None
        try:
            receiver = self._factory()
            receiver.__enter__()  # the public way to open without receiving
        except Exception as exc:  # SDK_ERRORS and anything else: the thread must not die
            error = translate(exc, "connect receiver", self._scrub)
            if receiver is not None:
                _close(receiver)
            with self._cond:
                self._error = error
                self._cond.notify_all()
            LOG.warning("%s", error)
            return min(RETRY_MAX, max(1.0, delay * 2))
        with self._cond:
            self._error = None
            if self._stopped:
                self._doomed.append(receiver)
            else:
                self._ready.append(SharedReceiver(self, receiver))
            self._cond.notify_all()
        return 0.0

    def close(self, timeout: float = 5.0) -> None:
        """Close every ready receiver; the opener thread ends (it may be stuck in an open on
        a dead network, so it is a daemon thread and we wait only ``timeout``, at most
        ``EXIT_CLOSE_WAIT`` in all).

        The receivers close at once, each on a (daemon) thread of its own: a close drains
        the link, releases what that brought in, sends the detach and the connection's
        close, and ends with a join of the SDK's keep-alive thread, which sleeps in steps
        of 1 s.  Waiting for that join cost every exit up to a second; only the closes of
        receivers that may have credit out are waited for, and a close still
        running after ``EXIT_CLOSE_WAIT`` is left to the process's exit, where the kernel closes
        its socket and the broker drops the link as after a crash -- by then every lease
        is settled, so nothing is left locked."""
        with self._cond:
            self._stopped = True
            ready, self._ready = list(self._ready), collections.deque()
            self._cond.notify_all()
            thread = self._thread
            opening = self._opening  # then what it opens and closes never received
        # A receiver with leases not over is closed by its last lease, not here.
        closing = [shared for shared in ready if shared.retire(close=False)]
        closers = [start_thread(partial(_close, shared.receiver), "sb-close")
                   for shared in closing]
        start = time.monotonic()
        for shared, closer in zip(closing, closers):
            if shared.credit_left:  # else nothing can come in for the close to release
                closer.join(max(0.0, start + min(timeout, EXIT_CLOSE_WAIT) - time.monotonic()))
        if thread is not None and not opening:
            # Its own closes of retired receivers (usually none by now), within the same
            # budget.  Not an open under way: a worker's exit soon after its start found it
            # opening the second receiver (~0.3 s more).  A receiver that never received
            # holds no lock; the thread closes it once open, or the process's exit drops it.
            thread.join(max(0.0, start + min(timeout, EXIT_CLOSE_WAIT) - time.monotonic()))


def _close(receiver: ServiceBusReceiver) -> None:
    try:
        receiver.close()
    except Exception as exc:  # closing is best effort; the broker drops the link anyway
        LOG.debug("closing a receiver failed: %s: %s", type(exc).__name__, exc)
