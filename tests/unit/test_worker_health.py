"""The systemd watchdog ping is withheld while a lease thread is stalled (fake clock)."""

from __future__ import annotations

import logging
import socket

import pytest

from supervisor.backends.base import BackendError
from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.settings import Settings
from supervisor.worker.keeper import LeaseKeeper
from supervisor.worker.loop import Worker
from tests.fakes.clock import FakeClock


class NeverCalledLease:
    task = None
    format_error = None
    raw_body = ""
    attempt = 1
    message_id = "m"
    lock_duration = 60.0

    def renew(self, timeout: float) -> float:  # pragma: no cover - never driven here
        raise AssertionError


def _drain(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


@pytest.fixture
def notify_sock(tmp_path, monkeypatch):
    path = str(tmp_path / "n.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


def test_stalled_lease_thread_stops_watchdog_pings(tmp_path, notify_sock):
    clock = FakeClock(1000.0)
    backend = SqliteBackend(str(tmp_path / "q.db"), "default", "w")
    worker = Worker(Settings(sqlite_path=str(tmp_path / "q.db"), worker_id="w"), backend,
                    clock=clock)
    keeper = LeaseKeeper(NeverCalledLease(), "t1", t_sent=clock.now, granted=60.0,
                         renew_interval=20.0, clock=clock)
    worker.settling.append(keeper)
    assert worker.reporter.watchdog_ping == 1.0  # half of WATCHDOG_USEC

    worker._report(clock.now)
    assert "WATCHDOG=1" in _drain(notify_sock)

    # A renewal call in flight past its own timeout plus grace: the thread is stuck.
    keeper.call_started, keeper.call_timeout = clock.now, 3.0
    clock.now += 9.0
    worker._report(clock.now)
    assert "WATCHDOG=1" not in _drain(notify_sock)
    clock.now += 1.0
    worker._report(clock.now)
    assert "WATCHDOG=1" not in _drain(notify_sock)

    # The call returns: pings resume.
    keeper.call_started = None
    keeper.next_renew = clock.now + 20.0
    clock.now += 1.0
    worker._report(clock.now)
    assert "WATCHDOG=1" in _drain(notify_sock)

    # A renewal that is due but never started (the thread died or hangs elsewhere).
    clock.now = keeper.next_renew + 6.0
    worker._report(clock.now)
    assert "WATCHDOG=1" not in _drain(notify_sock)
    backend.close()


def test_an_unexpected_receive_error_backs_off_instead_of_ending_the_worker(tmp_path):
    """A client library's bug in receive (the Storage Queue SDK has raised RuntimeError from
    a race in its model cache) is retried like a backend error, not fatal."""

    class Buggy(SqliteBackend):
        calls = 0

        def receive(self, max_messages, lock_duration):
            Buggy.calls += 1
            raise RuntimeError("dictionary changed size during iteration")

    clock = FakeClock(1000.0)
    backend = Buggy(str(tmp_path / "q.db"), "default", "w")
    worker = Worker(Settings(sqlite_path=str(tmp_path / "q.db"), worker_id="w"), backend,
                    clock=clock)
    worker.next_receive = clock.now
    worker._receive(clock.now)
    assert Buggy.calls == 1
    assert worker.pacing.backoff == 1.0 and worker.next_receive == clock.now + 1.0
    backend.close()


def test_a_receive_outage_is_logged_once_a_minute_not_per_retry(tmp_path, caplog):
    """A database that became read-only (or a queue service that is down) is retried with
    back-off and logged rate-limited, then once when it works again (issue 14 bug 3)."""
    class Failing(SqliteBackend):
        fail = True

        def receive(self, max_messages, lock_duration):
            if Failing.fail:
                raise BackendError("attempt to write a readonly database")
            return []

    clock = FakeClock(1000.0)
    backend = Failing(str(tmp_path / "q.db"), "default", "w")
    worker = Worker(Settings(sqlite_path=str(tmp_path / "q.db"), worker_id="w"), backend,
                    clock=clock)
    start = clock.now
    with caplog.at_level(logging.INFO, logger="jobq.worker"):
        while clock.now < start + 600:  # ten minutes of an outage, retried as scheduled
            worker.next_receive = clock.now
            worker._receive(clock.now)
            clock.now += worker.pacing.backoff
        Failing.fail = False
        worker.next_receive = clock.now
        worker._receive(clock.now)
    failed = [r for r in caplog.records
              if r.getMessage().startswith("queue unavailable (receive failed")]
    assert worker.pacing.backoff == 0.0
    assert 10 <= len(failed) <= 11, [r.getMessage() for r in failed]  # not ~60
    assert "failure(s) so far" in failed[-1].getMessage()
    assert any("queue reachable again after" in r.getMessage() for r in caplog.records)
    backend.close()
