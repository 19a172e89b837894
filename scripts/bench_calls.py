"""Counting the storage calls a worker makes: an HTTP-aware TCP proxy in front of Azurite.

The Azure SDK speaks HTTP/1.1 with keep-alive; the proxy relays bytes both ways untouched and
reads the client's side as a stream of requests (request line, headers, ``Content-Length``
body), classifying each by method and path: a receive is ``GET .../messages``, a renewal or a
release ``PUT .../messages/ID?popreceipt=...``, a delete ``DELETE .../messages/ID``, table and
blob calls by their service's port.  Counted for real, whatever code path made the call.

Used by ``bench_fleet.py`` and ``bench_startup.py``.  The proxy runs on threads of its own
(one acceptor, two relays per connection), all stopped by ``close()``.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from benchlib import ACCOUNT_KEY


def classify(service: str, method: str, target: str) -> str:
    """One request -> its kind, e.g. ``queue receive``, ``queue renew/release``, ``table
    upsert``."""
    url = urlsplit(target)
    parts = [p for p in url.path.split("/") if p]
    query = url.query
    if service == "queue":
        if len(parts) >= 3 and parts[2] == "messages":
            if len(parts) >= 4:  # one message
                return {"PUT": "queue renew/release", "DELETE": "queue delete"}.get(
                    method, f"queue {method} message")
            if method == "GET":
                return "queue peek" if "peekonly=true" in query else "queue receive"
            return {"POST": "queue put", "DELETE": "queue clear"}.get(method,
                                                                      f"queue {method} messages")
        if len(parts) == 2:
            if method == "PUT":
                return "queue create" if "comp=metadata" not in query else "queue set metadata"
            if method == "GET":
                return "queue properties"
            if method == "DELETE":
                return "queue delete queue"
        return f"queue {method} other"
    if service == "table":
        if parts[-1:] == ["$batch"]:
            return "table batch"
        if len(parts) >= 2 and parts[1].startswith("Tables"):
            return "table create" if method == "POST" else f"table {method} tables"
        if len(parts) >= 2 and parts[1].endswith("()"):
            return "table query" if method == "GET" else f"table {method} query"
        if len(parts) >= 2 and "(" in parts[1]:
            return {"GET": "table get", "PUT": "table upsert", "MERGE": "table merge",
                    "PATCH": "table merge", "DELETE": "table delete"}.get(method,
                                                                          f"table {method}")
        return {"GET": "table query", "POST": "table insert"}.get(method, f"table {method}")
    return f"{service} {method}"


class _Stream:
    """The client -> server bytes of one connection, parsed into requests as they pass."""

    def __init__(self, on_request: Callable[[str, str], None]) -> None:
        self.buf = b""
        self.body_left = 0
        self.on_request = on_request

    def feed(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.body_left:
                take = min(self.body_left, len(self.buf))
                self.buf = self.buf[take:]
                self.body_left -= take
                if self.body_left:
                    return
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4:]
            lines = head.split("\r\n")
            method, target = (lines[0].split(" ") + ["", ""])[:2]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip() or 0)
            self.body_left = length
            self.on_request(method, target)


class CountingProxy:
    """127.0.0.1:``port`` -> 127.0.0.1:``upstream``; ``calls`` counts the requests by kind
    (with their monotonic times in ``log``).  Any thread may read ``snapshot()``."""

    def __init__(self, upstream: int, service: str = "queue") -> None:
        self.upstream, self.service = upstream, service
        self.calls: Counter[str] = Counter()
        self.log: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="counting-proxy", daemon=True)
        self._thread.start()

    def _note(self, method: str, target: str) -> None:
        kind = classify(self.service, method, target)
        with self._lock:
            self.calls[kind] += 1
            self.log.append((time.monotonic(), kind))

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.calls)

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.log.clear()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except (socket.timeout, OSError):
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._conns += [client, server]
            stream = _Stream(self._note)
            for src, dst, parse in ((client, server, stream.feed), (server, client, None)):
                threading.Thread(target=self._relay, args=(src, dst, parse), daemon=True,
                                 name="counting-proxy-relay").start()

    def _relay(self, src: socket.socket, dst: socket.socket,
               parse: Callable[[bytes], None] | None) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if parse is not None:
                    parse(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        for s in self._conns:
            s.close()


class CountedAzurite:
    """Azurite's queue, table and blob services (one process, in memory) with a
    CountingProxy in front of each; ``conn_str`` names the proxies.  ``close()`` stops both."""

    def __init__(self, cwd: Path) -> None:
        from bench_output import _azurite_all

        self.proc, direct = _azurite_all(cwd)
        self.proxies: dict[str, CountingProxy] = {}
        for part in direct.split(";"):
            name, _, url = part.partition("=")
            if name.endswith("Endpoint") and name != "DefaultEndpointsProtocol":
                service = name[:-len("Endpoint")].lower()
                port = int(url.split(":")[2].split("/")[0])
                self.proxies[service] = CountingProxy(port, service)
        self.conn_str = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                         f"AccountKey={ACCOUNT_KEY}" + "".join(
                             f";{s.capitalize()}Endpoint=http://127.0.0.1:{p.port}/devstoreaccount1"
                             for s, p in self.proxies.items()))

    def reset(self) -> None:
        for p in self.proxies.values():
            p.reset()

    def calls(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for p in self.proxies.values():
            total += p.snapshot()
        return total

    def timeline(self) -> list[tuple[float, str]]:
        """Every call since the last reset, (monotonic time, kind), in order."""
        out: list[tuple[float, str]] = []
        for p in self.proxies.values():
            with p._lock:
                out += p.log
        return sorted(out)

    def close(self) -> None:
        for p in self.proxies.values():
            p.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
