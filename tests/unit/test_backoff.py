"""The one back-off / outage-logging helper (core/backoff.py), and the backend's opening at
start (worker/startup.py), which keeps its own line with it (a queue failing beside others:
test_multi_queue.py).  Injected clock, no sleeps."""

from __future__ import annotations

import logging
import queue
from typing import Any

import pytest

from supervisor.backends.base import BackendError
from supervisor.core.backoff import Outage
from supervisor.core.settings import Settings
from supervisor.worker import startup
from supervisor.worker.preemption import SignalQueue
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(30)
log = logging.getLogger("jobq.test-backoff")


def lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == logger]


def test_the_default_lines_and_a_callers_own_words(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock(100.0)
    default = Outage("control store", log, clock, log_every=60.0, repeat=True,
                     effect="tasks are not affected")
    own = Outage("backend", log, clock, log_every=0.0, repeat=True, recovery=None,
                 warning="%(call)s: attempt %(failures)d, %(error)s; next in %(backoff).0fs")
    assert [default.failed("call", "down"), own.failed("open", "down")] == [1.0, 1.0]
    clock.now += 1
    assert [default.failed("call", "down"), own.failed("open", "down")] == [2.0, 2.0]
    default.succeeded()
    own.succeeded()
    assert lines(caplog, log.name) == [
        ("WARNING", "control store unavailable (call failed, 1 failure(s) so far; retrying in "
                    "1s; tasks are not affected): down"),
        ("WARNING", "open: attempt 1, down; next in 1s"),
        ("WARNING", "open: attempt 2, down; next in 2s"),  # log_every 0: every failure
        ("INFO", "control store reachable again after 2 failed call(s)")]  # own: none


def test_start_up_logs_every_try_and_doubles_its_pause_to_30s(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """open_with_retry: one WARNING per failed try on logger "jobq", 1 s doubling to 30 s,
    and the pause it waits for a stop signal is the one the line names."""
    caplog.set_level(logging.INFO)
    tries: list[int] = []
    waits: list[float] = []
    opened = object()

    def opener(settings: Settings) -> Any:
        tries.append(1)
        if len(tries) <= 7:
            raise BackendError(f"disk is full ({len(tries)})")
        return opened

    def wait_for_stop(signals: SignalQueue, timeout: float, _log: logging.Logger) -> None:
        waits.append(timeout)

    monkeypatch.setattr(startup, "open_backend", opener)
    monkeypatch.setattr(startup, "_wait_for_stop", wait_for_stop)
    got = startup.open_with_retry(Settings(), SignalQueue(queue.SimpleQueue()))
    assert got is opened
    pauses = [1, 2, 4, 8, 16, 30, 30]
    assert waits == [*pauses, 0]
    assert lines(caplog, "jobq") == [
        ("WARNING", f"backend not reachable (attempt {n}): disk is full ({n}); retrying in "
                    f"{pause}s") for n, pause in enumerate(pauses, 1)]
