"""Notifier against real AF_UNIX datagram sockets (a path in tmp_path and an abstract one)."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.worker.notify import Notifier

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2.0)  # a missing datagram fails the test instead of hanging it
    yield sock, path
    sock.close()


@pytest.fixture
def abstract_receiver() -> Iterator[tuple[socket.socket, str]]:
    name = f"jobq-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2.0)
    yield sock, "@" + name
    sock.close()


@pytest.mark.parametrize("socket_fixture", ["receiver", "abstract_receiver"])
def test_each_message_is_one_datagram_with_exact_bytes(request, socket_fixture) -> None:
    """On a socket path and on an abstract socket (``@name``) alike."""
    sock, address = request.getfixturevalue(socket_fixture)
    n = Notifier(env={"NOTIFY_SOCKET": address})
    assert n.enabled
    assert n.ready()
    assert sock.recv(4096) == b"READY=1"
    assert n.status("3 of 4 slots busy")
    assert sock.recv(4096) == b"STATUS=3 of 4 slots busy"
    assert n.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert n.stopping()
    assert sock.recv(4096) == b"STOPPING=1"
    assert n.send("EXTEND_TIMEOUT_USEC=5000000")
    assert sock.recv(4096) == b"EXTEND_TIMEOUT_USEC=5000000"


def test_reloading_says_when_on_the_monotonic_clock(receiver) -> None:
    """sd_notify(3): RELOADING=1 comes with MONOTONIC_USEC, CLOCK_MONOTONIC in microseconds."""
    sock, path = receiver
    before = time.monotonic_ns() // 1000
    assert Notifier(path).reloading()
    head, stamp = sock.recv(4096).decode().split("\n")
    assert head == "RELOADING=1" and stamp.startswith("MONOTONIC_USEC=")
    assert before <= int(stamp.split("=")[1]) <= time.monotonic_ns() // 1000


def test_status_keeps_to_one_line(receiver) -> None:
    sock, path = receiver
    Notifier(path).status("draining\nREADY=1")
    assert sock.recv(4096) == b"STATUS=draining READY=1"


def test_explicit_path_wins_over_env(receiver, tmp_path: Path) -> None:
    sock, path = receiver
    n = Notifier(path, env={"NOTIFY_SOCKET": str(tmp_path / "elsewhere")})
    n.ready()
    assert sock.recv(4096) == b"READY=1"


def test_default_env_is_os_environ(receiver, monkeypatch) -> None:
    sock, path = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    Notifier().stopping()
    assert sock.recv(4096) == b"STOPPING=1"


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}])
def test_disabled_without_notify_socket(env, monkeypatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    sent = []
    monkeypatch.setattr(socket.socket, "sendto", lambda *a: sent.append(a))
    for n in (Notifier(env=env), Notifier()):
        assert not n.enabled
        assert n.ready() is False
        assert n.status("x") is False
        assert n.watchdog() is False
        assert n.stopping() is False
    assert sent == []


def test_missing_socket_does_not_raise(tmp_path: Path, caplog) -> None:
    n = Notifier(env={"NOTIFY_SOCKET": str(tmp_path / "no-such.sock")})
    assert n.enabled
    with caplog.at_level("DEBUG", logger="jobq.notify"):
        assert n.ready() is False
        assert n.watchdog() is False
    assert [r.levelname for r in caplog.records] == ["DEBUG", "DEBUG"]
    assert Notifier(env={"NOTIFY_SOCKET": "@no-such-abstract-" + uuid.uuid4().hex}).ready() \
        is False


def test_path_that_is_not_a_socket_does_not_raise(tmp_path: Path) -> None:
    plain = tmp_path / "plain-file"
    plain.write_text("")
    assert Notifier(str(plain)).ready() is False


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"WATCHDOG_USEC": "30000000"}, 30.0),
    ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(os.getpid())}, 0.5),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "junk"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "-5"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({"WATCHDOG_USEC": ""}, None),
])
def test_watchdog_interval(env, expected) -> None:
    assert Notifier(env=env).watchdog_interval() == expected


def test_watchdog_interval_reads_os_environ_by_default(monkeypatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert Notifier().watchdog_interval() == 2.0
