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
