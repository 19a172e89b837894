"""Issue 14 bug 3: the stale-lock reaper backs off while the database refuses writes."""

from __future__ import annotations

import logging

import pytest

from supervisor.backends.base import BackendError
from supervisor.backends.sqlite.backend import SqliteBackend

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_reaper_backs_off_up_to_its_interval(tmp_path, caplog) -> None:
    backend = SqliteBackend(str(tmp_path / "jobs.db"), "q", "A", reaper_interval=300.0)
    clock = Clock()
    backend.clock = clock
    calls: list[float] = []

    def refuse() -> int:
        calls.append(clock.now)
        raise BackendError("SQLite: attempt to write a readonly database")

    backend.reap = refuse  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="jobq.sqlite"):
            while clock.now < 1000.0 + 3600:
                backend.maintenance()
                clock.now += 1.0
    finally:
        backend.close()
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert gaps[:6] == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0], gaps
    assert set(gaps[7:]) == {300.0}, gaps
    # an hour of refusals: about 17 lines, not 720 (one every 5 s)
    assert len(caplog.records) == len(calls) < 20
