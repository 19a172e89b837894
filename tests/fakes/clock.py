"""FakeClock: the injected monotonic (or wall) clock of unit and contract tests."""

from __future__ import annotations


class FakeClock:
    """The injected monotonic clock: moves only when a test says so."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
