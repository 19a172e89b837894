"""The bound on settlements in flight (Settlement.backlogged): a slot frees when its shell
exits, so a broker slow to settle must not let settlements (a keeper thread and a held
message each) pile up without end.  Keepers run on their own threads here, blocked in a
settlement call until the test lets them go."""

from __future__ import annotations

import logging
import threading

import pytest
from test_settlement import Harness

from supervisor.worker.settlement import SETTLING_MIN, SETTLING_PER_SLOT
from supervisor.worker.watchdog import RunningTask
from tests.fakes.lease import FakeLease
from tests.fakes.worker import FakeOutput

pytestmark = pytest.mark.timeout(30)


class SlowLease(FakeLease):
    """A lease whose complete waits for ``gate`` (a broker slow to delete)."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def complete(self) -> None:
        assert self.gate.wait(20)
        super().complete()


def _exited(h: Harness, gate: threading.Event) -> RunningTask:
    rt = h.finished(0)
    rt.keeper.lease = rt.lease = SlowLease(gate)
    rt.proc.output = FakeOutput("")
    rt.exited_at = h.clock.now
    return rt


def test_the_bound_scales_with_the_slots():
    assert Harness(num_workers=1).settlement.max_settling == SETTLING_MIN
    assert Harness(num_workers=16).settlement.max_settling == SETTLING_PER_SLOT * 16


def test_receiving_stops_at_the_bound_and_resumes_when_settlements_end(caplog):
    caplog.set_level(logging.INFO, logger="jobq.worker")
    h = Harness(num_workers=2)
    s, gate = h.settlement, threading.Event()
    bound = s.max_settling
    keepers = []
    for _ in range(bound - 1):
        rt = _exited(h, gate)
        s.conclude(rt, h.clock.now, stopping=False)
        keepers.append(rt.keeper)
    assert s.in_flight() == bound - 1
    assert not s.backlogged([])
    # A shell that exited and is not settled yet counts: its settlement is due.
    pending = _exited(h, gate)
    assert s.backlogged([pending])
    s.conclude(pending, h.clock.now, stopping=False)
    keepers.append(pending.keeper)
    assert s.backlogged([]) and s.in_flight() == bound
    assert "settlements in flight (the broker is slow to settle)" in caplog.text
    gate.set()
    for keeper in keepers:
        assert keeper.join(10)
    assert s.in_flight() == 0 and not s.backlogged([])
    assert "settlements caught up" in caplog.text
    s.prune()
    assert s.counts["succeeded"] == bound
