"""ReceiverPool's exit (servicebus_pool.py) with stand-in receivers: the pool's own threads and
budgets are what is tested here; the SDK's receivers are tested against the broker."""

from __future__ import annotations

import threading
import time

import pytest

from supervisor.backends.azure_common import Scrubber
from supervisor.backends.servicebus import pool as servicebus_pool
from supervisor.backends.servicebus.pool import ReceiverPool

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def long_budget(monkeypatch) -> None:
    """The exit's budget made long: a wait the pool must not make shows as a close that
    does not return within the test's 10 s, not as 0.5 s that timing noise could hide."""
    monkeypatch.setattr(servicebus_pool, "EXIT_CLOSE_WAIT", 30.0)


class StandIn:
    """Opens at once, or only once ``gate`` is set; records its close, which takes
    ``close_takes`` seconds, or lasts until ``close_gate`` is set."""

    def __init__(self, gate: threading.Event | None = None, close_takes: float = 0.0,
                 close_gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.close_takes = close_takes
        self.close_gate = close_gate
        self.entered = threading.Event()
        self.closed = threading.Event()

    def __enter__(self) -> StandIn:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        return self

    def close(self) -> None:
        if self.close_gate is not None:
            assert self.close_gate.wait(30), "the test never let the close end"
        threading.Event().wait(self.close_takes)
        self.closed.set()


def test_close_does_not_wait_for_an_open_under_way() -> None:
    # A worker that exits soon after its start finds the opener thread opening its second
    # receiver (~0.3 s of handshake on loopback): the exit must not wait for that.
    gate = threading.Event()
    first, second = StandIn(), StandIn(gate)
    opens = iter([first, second])
    pool = ReceiverPool(lambda: next(opens), Scrubber(None, None))
    pool.start(2, 10.0)
    assert second.entered.wait(10), "the opener never began the second open"
    closing = threading.Thread(target=pool.close, kwargs={"timeout": 30.0})
    closing.start()
    closing.join(10)  # the budget is 30 s: ending well before it is the point
    assert not closing.is_alive(), "close waited for the open under way"
    assert first.closed.wait(10)
    assert not second.closed.is_set()
    gate.set()  # the open completes after the pool closed: the thread closes that receiver
    assert second.closed.wait(10)
    deadline = time.monotonic() + 10
    while any(t.name == "sb-opener" and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the opener thread did not end"
        time.sleep(0.01)


def test_close_waits_only_for_receivers_that_may_have_credit_out() -> None:
    # A receive that got fewer messages than it asked for left credit out: what it brings in
    # is released by that receiver's close, so the exit waits for it (within its budget).
    # A receiver without credit out has nothing to release: its close (~0.3-1 s with the
    # SDK's keep-alive join) is not waited for.
    gate = threading.Event()
    credit, quiet = StandIn(close_takes=0.1), StandIn(close_gate=gate)
    opens = iter([credit, quiet])
    pool = ReceiverPool(lambda: next(opens), Scrubber(None, None))
    pool.start(2, 10.0)
    deadline = time.monotonic() + 10
    while len(pool._ready) < 2:
        assert time.monotonic() < deadline, "the second receiver never opened"
        time.sleep(0.01)
    for shared in pool._ready:
        shared.credit_left = shared.receiver is credit
    closing = threading.Thread(target=pool.close, kwargs={"timeout": 30.0})
    closing.start()
    closing.join(10)
    assert not closing.is_alive(), "close waited for a receiver without credit out"
    assert credit.closed.is_set(), "close did not wait for the receiver with credit out"
    assert not quiet.closed.is_set()
    gate.set()
    assert quiet.closed.wait(10)
