"""Fixtures shared by the unit tests (the fakes themselves are in tests/fakes/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fakes.clock import FakeClock
from tests.fakes.follow import follow_world
from tests.fakes.worker import T0


@pytest.fixture
def clock() -> FakeClock:
    """The injected monotonic clock, at T0 (a module may define its own ``clock``)."""
    return FakeClock(T0)


@pytest.fixture
def db(tmp_path: Path) -> str:
    """The path of a SQLite queue file in tmp_path, not made yet."""
    return str(tmp_path / "jobs.db")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[SimpleNamespace]:
    """A follower's world (tests/fakes/follow.py): the real stores and an EventClock."""
    yield from follow_world(tmp_path)
