"""A loopback TCP proxy that can black-hole, delay and reset traffic (threads, no asyncio).

Used to put faults between a backend's SDK and its local test server::

    proxy = FaultProxy(("127.0.0.1", azurite_port))
    client connects to 127.0.0.1:proxy.port
    proxy.blackhole()   # bytes stop flowing both ways; sockets stay open, so calls hang
    proxy.restore()     # held bytes are delivered, traffic flows again
    proxy.reset_all()   # every current connection is closed with a TCP RST
    proxy.latency(0.5)  # each forwarded chunk waits 0.5 s first
    proxy.delay_requests(b"DELETE ", 2.0)  # client chunks starting so wait 2 s first
    proxy.close()

Only loopback addresses are accepted, for the listener and for the target.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time

_CHUNK = 65536
_POLL = 0.05  # seconds between checks of the black-hole flag and the stop flag


def _abort(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0) rather than FIN, like a crashed peer or a middlebox."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Connection:
    """One accepted client socket and its upstream socket, pumped by two threads."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._half_closed = 0
        self.threads = [
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True,
                             name="proxy-up"),
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True,
                             name="proxy-down"),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def abort(self) -> None:
        """Any thread: reset both sides at once."""
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        _abort(self.client)
        _abort(self.upstream)
        self.proxy._forget(self)

    def _finish_direction(self, dst: socket.socket) -> None:
        # Half-close: pass the EOF on; close both sockets once both directions ended.
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with self._lock:
            self._half_closed += 1
            done = self._half_closed == 2 and not self.closed.is_set()
            if done:
                self.closed.set()
        if done:
            self.client.close()
            self.upstream.close()
            self.proxy._forget(self)

    def _wait_flowing(self) -> bool:
        """Block while black-holed; False when the connection or proxy is closing."""
        while not self.closed.is_set():
            if self.proxy._flowing.wait(_POLL):
                return not self.closed.is_set()
        return False

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Pump thread: copy src -> dst, honouring black-hole and latency."""
        try:
            while self._wait_flowing():
                readable, _, _ = select.select([src], [], [], _POLL)
                if not readable:
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    self._finish_direction(dst)
                    return
                delay = self.proxy._latency
                if delay > 0:
                    time.sleep(delay)
                if src is self.client:
                    self.proxy._hold_request(data)
                # Bytes read just before a blackhole() are held, not sent, until restore().
                if not self._wait_flowing():
                    return
                dst.sendall(data)
        except (OSError, ValueError):
            # ValueError: select() on a socket another thread closed (fd -1).
            self.abort()


class FaultProxy:
    """Forward 127.0.0.1:<port> to ``target``; see the module docstring."""

    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        for addr in (host, target[0]):
            if addr not in ("127.0.0.1", "localhost", "::1"):
                raise ValueError(f"FaultProxy only works on loopback, not {addr!r}")
        self.target = target
        self._flowing = threading.Event()
        self._flowing.set()
        self._latency = 0.0
        self._request_delay: tuple[bytes, float] | None = None
        self.held = 0  # requests being delayed now (delay_requests)
        self.held_max = 0  # the most ever delayed at once
        self.held_total = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self.accepted = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(64)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                          name="proxy-accept")
        self._acceptor.start()

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def connection_count(self) -> int:
        with self._lock:
            return len(self._connections)

    def blackhole(self) -> None:
        """Stop forwarding in both directions; sockets stay open, so peers just wait."""
        self._flowing.clear()

    def restore(self) -> None:
        """Forward again (held bytes go first)."""
        self._flowing.set()

    def latency(self, seconds: float) -> None:
        """Delay each forwarded chunk by ``seconds`` (0 turns it off)."""
        self._latency = max(0.0, float(seconds))

    def delay_requests(self, prefix: bytes, seconds: float) -> None:
        """Hold each chunk a client sends that starts with ``prefix`` (an HTTP method, say)
        ``seconds`` before forwarding it -- a server slow at one kind of request.  That
        connection's later bytes wait behind it.  ``seconds`` 0 turns it off."""
        self._request_delay = (prefix, float(seconds)) if seconds > 0 else None

    def _hold_request(self, data: bytes) -> None:
        """Pump thread: the delay of ``delay_requests``, counted in ``held``/``held_max``."""
        rule = self._request_delay
        if rule is None or not data.startswith(rule[0]):
            return
        with self._lock:
            self.held += 1
            self.held_total += 1
            self.held_max = max(self.held_max, self.held)
        try:
            self._stopping.wait(rule[1])
        finally:
            with self._lock:
                self.held -= 1

    def reset_all(self) -> int:
        """Close every current connection with RST; return how many there were."""
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            conn.abort()
        return len(conns)

    def close(self) -> None:
        """Stop accepting, reset all connections, join the threads."""
        self._stopping.set()
        self._flowing.set()
        try:
            self._listener.close()
        except OSError:
            pass
        self._acceptor.join(timeout=2)
        with self._lock:
            conns = list(self._connections)
        self.reset_all()
        for conn in conns:
            for t in conn.threads:
                t.join(timeout=2)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _accept_loop(self) -> None:
        """Acceptor thread: one _Connection per client; a dead target means an RST."""
        while not self._stopping.is_set():
            try:
                readable, _, _ = select.select([self._listener], [], [], _POLL)
                if not readable:
                    continue
                client, _ = self._listener.accept()
            except (OSError, ValueError):
                return  # listener closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _abort(client)
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            conn = _Connection(self, client, upstream)
            with self._lock:
                self._connections.add(conn)
                self.accepted += 1
            conn.start()
