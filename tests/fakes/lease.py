"""Leases for unit tests: one that records how it was settled, one whose every call's
outcome the test scripts."""

from __future__ import annotations

import threading
from typing import Any

from tests.fakes.clock import FakeClock


class FakeLease:
    """Records each settlement call as (method, arguments); never renews (the keeper gets a
    long lease, and the watchdog must never talk to the backend)."""

    def __init__(self, *, task: Any = None, attempt: int = 1, raw_body: str = "",
                 format_error: str | None = None, message_id: str = "msg-1",
                 queue: str = "default") -> None:
        self.task = task
        self.attempt = attempt
        self.raw_body = raw_body
        self.format_error = format_error
        self.message_id = message_id
        self.queue = queue  # default: the queue of Settings() (a worker's single queue)
        self.lock_duration = 2700.0
        self.calls: list[tuple[Any, ...]] = []
        self.refuse: Exception | None = None  # raised by every settlement call when set
        self._lock = threading.Lock()  # the keeper may settle on its own thread

    def renew(self, timeout: float) -> float:  # pragma: no cover - never driven here
        raise AssertionError("no renewal is due in these tests")

    def complete(self) -> None:
        with self._lock:
            self.calls.append(("complete",))
        if self.refuse is not None:
            raise self.refuse

    def release(self, count_attempt: bool, delay: float = 0.0) -> None:
        with self._lock:
            self.calls.append(("release", count_attempt, delay))
        if self.refuse is not None:
            raise self.refuse

    def dead_letter(self, reason: str, output_tail: str, exit_status: int | None = None) -> None:
        with self._lock:
            self.calls.append(("dead_letter", reason, output_tail, exit_status))
        if self.refuse is not None:
            raise self.refuse


class ScriptedLease:
    """Records renew timeouts and settlement calls; each call's outcome is scripted.

    ``outcomes`` is consumed one per renew call: a number (granted seconds), an exception
    instance to raise, or None for ``self.granted``.  ``call_duration`` advances the fake clock
    during the call (a slow call).  ``settle_errors`` is consumed one per settlement call (an
    exception to raise, or None: it succeeds); each call advances the clock ``settle_duration``
    and is recorded in ``settle_calls`` (clock at call), a successful one also in ``settled``.
    """

    def __init__(self, clock: FakeClock, granted: float = 60.0) -> None:
        self.clock = clock
        self.granted = granted
        self.outcomes: list = []
        self.call_duration = 0.0
        self.renews: list[tuple[float, float]] = []  # (clock at call, timeout)
        self.settle_errors: list = []
        self.settle_duration = 0.0
        self.settle_calls: list[float] = []
        self.settled: list[str] = []

    def renew(self, timeout: float) -> float:
        self.renews.append((self.clock.now, timeout))
        self.clock.advance(self.call_duration)
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if isinstance(outcome, BaseException):
            raise outcome
        return self.granted if outcome is None else outcome

    def _settle(self, what: str) -> None:
        self.settle_calls.append(self.clock.now)
        self.clock.advance(self.settle_duration)
        error = self.settle_errors.pop(0) if self.settle_errors else None
        if error is not None:
            raise error
        self.settled.append(what)

    def complete(self) -> None:
        self._settle("complete")

    def release(self, count_attempt: bool, delay: float = 0.0) -> None:
        self._settle(f"release({count_attempt}, {delay:g})")

    def dead_letter(self, reason: str, output_tail: str, exit_status=None) -> None:
        self._settle(f"dead_letter({reason}, {output_tail}, {exit_status})")
