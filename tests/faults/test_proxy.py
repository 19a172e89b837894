"""Tests of the fault-injecting loopback proxy against a local echo server."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import closing

import pytest

from .proxy import FaultProxy

pytestmark = [pytest.mark.timing, pytest.mark.timeout(30)]  # timing: asserts sub-second bounds


class EchoServer:
    """Loopback echo server: one thread per client; returns what it reads."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self.sock.close()


@pytest.fixture
def echo():
    with closing(EchoServer()) as server:
        yield server


@pytest.fixture
def proxy(echo):
    with closing(FaultProxy(("127.0.0.1", echo.port))) as p:
        yield p


def _connect(proxy: FaultProxy, timeout: float = 2.0) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=timeout)


def _roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_forwards_both_ways(proxy):
    with _connect(proxy) as s:
        assert _roundtrip(s, b"hello") == b"hello"
        big = bytes(range(256)) * 2000
        assert _roundtrip(s, big) == big
    assert proxy.accepted == 1


def test_blackhole_hangs_then_restore_delivers(proxy):
    with _connect(proxy, timeout=0.5) as s:
        assert _roundtrip(s, b"a") == b"a"
        proxy.blackhole()
        s.sendall(b"held")
        start = time.monotonic()
        with pytest.raises(socket.timeout):
            s.recv(10)
        assert time.monotonic() - start >= 0.4
        proxy.restore()
        s.settimeout(2)
        got = b""
        while len(got) < 4:
            got += s.recv(10)
        assert got == b"held"


def test_blackhole_keeps_new_connections_silent(proxy):
    proxy.blackhole()
    with _connect(proxy, timeout=0.3) as s:  # the handshake still completes
        s.sendall(b"x")
        with pytest.raises(socket.timeout):
            s.recv(1)
    proxy.restore()


def test_reset_all_resets_current_connections(proxy):
    s = _connect(proxy)
    assert _roundtrip(s, b"a") == b"a"
    assert _wait_for(lambda: proxy.connection_count == 1)
    assert proxy.reset_all() == 1
    with pytest.raises(OSError):
        # ECONNRESET on recv or send; a bare EOF would mean FIN instead of RST.
        for _ in range(3):
            if not s.recv(1):
                raise AssertionError("got FIN, expected RST")
            s.sendall(b"b")
    s.close()
    with _connect(proxy) as s2:  # new connections still work
        assert _roundtrip(s2, b"c") == b"c"


def test_latency(proxy):
    with _connect(proxy) as s:
        proxy.latency(0.3)
        start = time.monotonic()
        assert _roundtrip(s, b"slow") == b"slow"
        assert time.monotonic() - start >= 0.55  # one delay each way
        proxy.latency(0)
        start = time.monotonic()
        assert _roundtrip(s, b"fast") == b"fast"
        assert time.monotonic() - start < 0.25


def test_delay_requests_holds_only_matching_chunks(proxy):
    with _connect(proxy) as slow, _connect(proxy) as other:
        proxy.delay_requests(b"DELETE ", 0.5)
        start = time.monotonic()
        assert _roundtrip(other, b"GET /") == b"GET /"  # not matched: at once
        assert time.monotonic() - start < 0.3
        done = []
        t = threading.Thread(target=lambda: done.append(_roundtrip(slow, b"DELETE /m")))
        t.start()
        assert _wait_for(lambda: proxy.held == 1, timeout=2)
        assert _roundtrip(other, b"PUT /") == b"PUT /"  # another connection is not held up
        t.join(5)
        assert done == [b"DELETE /m"] and time.monotonic() - start >= 0.45
        assert (proxy.held, proxy.held_max, proxy.held_total) == (0, 1, 1)
        proxy.delay_requests(b"DELETE ", 0)
        start = time.monotonic()
        assert _roundtrip(slow, b"DELETE /n") == b"DELETE /n"
        assert time.monotonic() - start < 0.3


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_target_gives_reset():
    with FaultProxy(("127.0.0.1", _closed_port())) as p:
        start = time.monotonic()
        # The RST may even beat connect() returning on loopback.
        with pytest.raises(ConnectionResetError), _connect(p) as s:
            s.recv(1)
        assert time.monotonic() - start < 1.0


def test_close_frees_port_and_stops_threads(echo):
    p = FaultProxy(("127.0.0.1", echo.port))
    s = _connect(p)
    assert _roundtrip(s, b"x") == b"x"
    p.close()
    with pytest.raises(OSError):
        socket.create_connection(p.address, timeout=1).close()
    assert _wait_for(lambda: not any(t.name.startswith("proxy-") and t.is_alive()
                                     for t in threading.enumerate()), timeout=3)
    s.close()


def test_refuses_non_loopback_target():
    with pytest.raises(ValueError):
        FaultProxy(("10.0.0.1", 80))
