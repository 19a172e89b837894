"""Signals to the supervisor itself: handlers only enqueue the signal number.

The main loop reads the same SimpleQueue it uses for its other wake-ups (task output closed,
lock lost), so a signal wakes it at once.  (The Azure Scheduled Events poller joins this module
with the operations issue.)
"""

from __future__ import annotations

import queue
import signal
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalQueue:
    """Installs handlers that put the signal number on ``events`` (main thread)."""

    def __init__(self, events: queue.SimpleQueue[Any]) -> None:
        self.events = events
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # Only this: no logging, no locks, no Event.set() in a signal handler.
        self.events.put_nowait(signum)

    def install(self) -> None:
        for sig in (*STOP_SIGNALS, signal.SIGCHLD, signal.SIGUSR1):
            self._previous[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
