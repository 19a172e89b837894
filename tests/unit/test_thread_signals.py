"""threads.py: every helper thread blocks every signal the worker catches, so that each lands
on the main thread, whose handler enqueues it at once (docs/architecture.rst, "Signals to
the worker")."""

from __future__ import annotations

import queue
import signal

import pytest

from supervisor.core.threads import start_fast, start_thread
from tests.integration.helpers import WORKER_SIGNALS

pytestmark = pytest.mark.timeout(30)

# Python's own SIG_IGN ones are no business of the threads.
CAUGHT = set(WORKER_SIGNALS) - {signal.SIGPIPE, signal.SIGXFSZ}


def _blocked_on(start) -> set[int]:  # type: ignore[no-untyped-def]
    seen: queue.SimpleQueue[set[int]] = queue.SimpleQueue()
    start(lambda: seen.put(set(signal.pthread_sigmask(signal.SIG_BLOCK, []))))
    return seen.get(timeout=10)


def test_start_thread_blocks_every_caught_signal() -> None:
    assert CAUGHT <= _blocked_on(lambda target: start_thread(target, "probe"))


def test_pooled_threads_block_every_caught_signal() -> None:
    assert CAUGHT <= _blocked_on(start_fast)


class Probe:
    """Records, on whatever thread calls it, that thread's name and blocked signals."""

    def __init__(self) -> None:
        self.seen: queue.SimpleQueue[tuple[str, set[int]]] = queue.SimpleQueue()

    def __call__(self) -> None:
        import threading

        self.seen.put((threading.current_thread().name,
                       set(signal.pthread_sigmask(signal.SIG_BLOCK, []))))

    def next(self) -> tuple[str, set[int]]:
        return self.seen.get(timeout=10)


def test_service_bus_opener_and_closer_threads_block_every_caught_signal() -> None:
    """The receiver pool's threads are started by start_thread too (stand-in receivers: no
    broker)."""
    from supervisor.backends.azure_common import Scrubber
    from supervisor.backends.servicebus.pool import ReceiverPool

    probe = Probe()

    class Receiver:
        def __enter__(self) -> Receiver:  # opened on the opener thread
            probe()
            return self

        def close(self) -> None:  # closed on a closer thread at the pool's close
            probe()

    pool = ReceiverPool(Receiver, Scrubber(None, None))  # type: ignore[arg-type]
    pool.start(1, 10.0)
    name, blocked = probe.next()
    assert name == "sb-opener" and CAUGHT <= blocked
    pool.close(timeout=10.0)
    name, blocked = probe.next()
    assert name == "sb-close" and CAUGHT <= blocked


def test_dashboard_sampler_thread_blocks_every_caught_signal() -> None:
    from supervisor.dashboard.history import History, Sampler

    probe = Probe()

    class Data:
        queue = "default"

        def counts(self) -> dict[str, int]:
            probe()
            return {"pending": 0, "succeeded": 0, "failed": 0}

        def close_thread(self) -> None:  # the sampler's last call on its thread
            pass

    sampler = Sampler(Data(), History(), interval=60)  # type: ignore[arg-type]
    sampler.start()
    try:
        name, blocked = probe.next()
    finally:
        sampler.close(timeout=10)
    assert name == "dashboard-sampler" and CAUGHT <= blocked
