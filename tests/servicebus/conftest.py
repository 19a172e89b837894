"""Pytest fixtures for the in-process Service Bus test broker.

The fixture runs on the test thread; the broker runs on its own thread (see broker.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from .broker import ServiceBusTestBroker


@pytest.fixture
def sb_broker() -> Iterator[ServiceBusTestBroker]:
    """A started broker on a free 127.0.0.1 port; stopped (thread joined, sockets closed) after.

    Default queue settings: lock duration 60 s, max delivery count 10, queues auto-created on
    first use. Use ``sb_broker.create_queue(name, lock_duration=..., max_delivery_count=...)``
    to configure a queue before the SDK touches it.
    """
    broker = ServiceBusTestBroker().start()
    try:
        yield broker
    finally:
        broker.stop()
    leftover = [t.name for t in threading.enumerate() if t.name.startswith("sb-test-broker")]
    assert not leftover, f"broker threads left behind: {leftover}"
    assert not broker.errors, f"errors inside the test broker: {broker.errors!r}"
