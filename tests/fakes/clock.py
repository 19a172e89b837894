"""Injected clocks for unit tests: time moves only when the test (or a fake sleep) says so."""

from __future__ import annotations

from collections.abc import Callable

from supervisor.ops.follow import POLL_MAX, Clock


class FakeClock:
    """The injected monotonic clock: moves only when a test says so."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class EventClock:
    """A follower's clock (``ops.follow.Clock``): ``sleep`` advances the time and runs what
    was scheduled (``at``) up to then; a sleep longer than the follower's ``POLL_MAX`` or a
    time past ``limit`` fails the test (a follower that never ends)."""

    def __init__(self, limit: float = 600.0) -> None:
        self.now = 0.0
        self.limit = limit
        self.events: list[tuple[float, int, Callable[[], None]]] = []

    def at(self, when: float, action: Callable[[], None]) -> None:
        self.events.append((when, len(self.events), action))
        self.events.sort(key=lambda e: (e[0], e[1]))

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert 0 < seconds <= POLL_MAX
        self.now += seconds
        while self.events and self.events[0][0] <= self.now:
            self.events.pop(0)[2]()
        assert self.now < self.limit, "the follower never ended"

    def clock(self) -> Clock:
        return Clock(self.monotonic, self.sleep)
