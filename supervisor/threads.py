"""Start daemon threads that never take the supervisor's signals.

Linux delivers a process-directed signal to any thread that does not block it; Python runs
handlers on the main thread only, but a signal that lands on a worker thread wakes the main
thread late.  Blocking our signals in every helper thread sends them to the main thread,
where the handler enqueues them at once.
"""

from __future__ import annotations

import _thread
import signal
import threading
from typing import Callable

HANDLED_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGUSR1, signal.SIGHUP}


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start ``target`` on a daemon thread with the supervisor's signals blocked (any thread)."""

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def start_fast(target: Callable[[], None]) -> None:
    """Like start_thread, without waiting for the thread to be scheduled (main thread).

    ``threading.Thread.start`` blocks until the new thread runs; on a busy 2-core machine that
    wait cost the main loop more per task than the spawn.  Lease keepers signal their own end
    through an Event, so they need no Thread object to join.
    """

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        target()

    _thread.start_new_thread(run, ())
