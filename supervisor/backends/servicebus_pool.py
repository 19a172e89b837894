"""Open PeekLock receivers kept ready by one opener thread (Service Bus backend).

Why: a receiver that settles a message must be the one that received it (the SDK settles
on the receive link by delivery id), and SDK clients are not thread-safe.  So every message
is received on a receiver of its own, which its lease then owns; once the lease is settled
the receiver comes back here for reuse.  Opening a connection (TLS, SASL, CBS, attach; ~0.5 s
even on loopback) happens on the opener thread only, never on the main thread: the SDK's
SASL handshake reads without any timeout, so a server that accepts TCP and then stays silent
would hang the caller until the network comes back.  Receivers that failed, or whose lease
was lost, are closed on the opener thread too (a close can take ~1 s on a dead link).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable

from .azure_common import Scrubber
from .base import BackendConfigError, BackendError
from .servicebus_util import translate

LOG = logging.getLogger(__name__)
RETRY_MAX = 10.0  # s between failed opens, at most


class ReceiverPool:
    """Thread-safe.  ``take`` is called by the main thread, ``give_back``/``discard`` by any."""

    def __init__(self, factory: Callable[[], Any], scrub: Scrubber) -> None:
        self._factory = factory  # makes an unopened receiver (opener thread only)
        self._scrub = scrub
        self._ready: collections.deque[Any] = collections.deque()
        self._doomed: list[Any] = []
        self._want = 1  # ready receivers to keep: the last receive's max_messages
        self._cap = 2  # ready receivers kept at most: the largest receive + 1
        self._cond = threading.Condition()
        self._stopped = False
        self._error: Exception | None = None  # the last open failure, until an open succeeds
        self._thread: threading.Thread | None = None

    def start(self, want: int, wait: float) -> None:
        """Start the opener thread and wait up to ``wait`` s for the first open receiver
        (raises like ``take``)."""
        self.give_back(self.take(want, wait), front=True)

    def take(self, n: int, wait: float) -> list[Any]:
        """Up to ``n`` open receivers; waits up to ``wait`` s for the first one.

        Raises BackendConfigError (bad credentials, no such queue) or BackendError when
        none is ready in time, never returns an empty list."""
        with self._cond:
            self._want = n
            self._cap = max(self._cap, n + 1)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sb-opener", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            deadline = time.monotonic() + wait
            while not self._ready and not self._stopped:
                if isinstance(self._error, BackendConfigError):
                    raise self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._error or BackendError(
                        f"receive: no connection to Service Bus ready after {wait:.1f}s")
                self._cond.wait(left)
            return [self._ready.popleft() for _ in range(min(n, len(self._ready)))]

    def give_back(self, receivers: list[Any], front: bool = False) -> None:
        """Healthy receivers with nothing unsettled on them, for reuse."""
        with self._cond:
            for receiver in reversed(receivers) if front else receivers:
                if self._stopped or len(self._ready) >= self._cap:
                    self._doomed.append(receiver)
                elif front:
                    self._ready.appendleft(receiver)
                else:
                    self._ready.append(receiver)
            self._cond.notify_all()

    def discard(self, receiver: Any) -> None:
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
                        len(self._ready) >= self._want or delay > 0):
                    if delay > 0:
                        self._cond.wait(delay)
                        delay = 0.0
                    else:
                        self._cond.wait()
                stopped = self._stopped
                doomed, self._doomed = self._doomed, []
                need = not stopped and len(self._ready) < self._want
            for receiver in doomed:
                _close(receiver)
            if stopped:
                return
            if need:
                delay = self._open_one(delay)

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
                self._ready.append(receiver)
            self._cond.notify_all()
        return 0.0

    def close(self, timeout: float = 5.0) -> None:
        """Close every ready receiver; the opener thread ends (it may be stuck in an open on
        a dead network, so it is a daemon thread and we wait only ``timeout``)."""
        with self._cond:
            self._stopped = True
            ready, self._ready = list(self._ready), collections.deque()
            self._cond.notify_all()
            thread = self._thread
        for receiver in ready:
            _close(receiver)
        if thread is not None:
            thread.join(timeout)


def _close(receiver: Any) -> None:
    try:
        receiver.close()
    except Exception as exc:  # closing is best effort; the broker drops the link anyway
        LOG.debug("closing a receiver failed: %s: %s", type(exc).__name__, exc)
