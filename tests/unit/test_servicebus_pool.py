"""ReceiverPool's exit (servicebus_pool.py) with stand-in receivers: the pool's own threads and
budgets are what is tested here; the SDK's receivers are tested against the broker."""

from __future__ import annotations

import threading
import time

import pytest

from supervisor.backends.azure_common import Scrubber
from supervisor.backends.servicebus_pool import ReceiverPool

pytestmark = pytest.mark.timeout(60)


class StandIn:
    """Opens at once, or only once ``gate`` is set; records its close."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.entered = threading.Event()
        self.closed = threading.Event()

    def __enter__(self) -> StandIn:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        return self

    def close(self) -> None:
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
    closing.join(10)  # the timeout would be 30 s: ending well before it is the point
    assert not closing.is_alive(), "close waited for the open under way"
    assert first.closed.wait(10)
    assert not second.closed.is_set()
    gate.set()  # the open completes after the pool closed: the thread closes that receiver
    assert second.closed.wait(10)
    deadline = time.monotonic() + 10
    while any(t.name == "sb-opener" and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the opener thread did not end"
        time.sleep(0.01)
