"""Fixtures shared by the unit tests (the fakes themselves are in supervisor_fakes.py)."""

from __future__ import annotations

import pytest
from supervisor_fakes import T0, FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """The injected monotonic clock, at T0 (a module may define its own ``clock``)."""
    return FakeClock(T0)
