"""FakeIMDS: a real HTTP server on 127.0.0.1 that plays Azure's instance metadata service.

It serves Scheduled Events (GET document, POST StartRequests) and the compute name, answers
400 without the ``Metadata: true`` header as the real one does, records every request, and can
be broken on demand: ``set_broken("500" | "garbage" | "hang" | None)``.  "hang" holds the
request for ``hang_seconds`` (past any client timeout) but ``close()`` releases it at once.

    with FakeIMDS() as imds:
        imds.set_events([{"EventId": "e1", "EventType": "Preempt", "Resources": []}])
        poller = ScheduledEventsPoller(imds.url, ...)
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
COMPUTE_NAME_PATH = "/metadata/instance/compute/name"
BROKEN_MODES = (None, "500", "garbage", "hang")


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str  # including the query string
    headers: dict[str, str]
    body: bytes


def preempt_event(event_id: str = "evt-1", event_type: str = "Preempt",
                  resources: list[str] | None = None,
                  not_before: str = "Mon, 19 Sep 2016 18:29:47 GMT") -> dict[str, Any]:
    """One event as Azure writes it (api-version 2020-07-01)."""
    return {
        "EventId": event_id,
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": list(resources or []),
        "EventStatus": "Scheduled",
        "NotBefore": not_before,
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


class _Server(ThreadingHTTPServer):
    # Join handler threads on close, so a test leaves no thread behind.
    daemon_threads = False
    block_on_close = True
    fake: FakeIMDS


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        self.server.fake._handle(self, b"")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.server.fake._handle(self, self.rfile.read(length))


class FakeIMDS:
    def __init__(self, compute_name: str = "fake-vm", hang_seconds: float = 10.0) -> None:
        self.compute_name = compute_name
        self.hang_seconds = hang_seconds
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._incarnation = 1
        self._broken: str | None = None
        self._requests: list[Recorded] = []
        self._release = threading.Event()  # ends every hang at close()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self.base = f"http://127.0.0.1:{self._server.server_port}"
        self.url = f"{self.base}{SCHEDULED_EVENTS_PATH}?api-version=2020-07-01"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name="fake-imds", daemon=True)
        self._thread.start()

    # -- test side -----------------------------------------------------------------------
    def set_events(self, events: list[dict[str, Any]]) -> None:
        with self._lock:
            self._events = [dict(e) for e in events]
            self._incarnation += 1

    def set_broken(self, mode: str | None) -> None:
        if mode not in BROKEN_MODES:
            raise ValueError(f"mode must be one of {BROKEN_MODES}")
        with self._lock:
            self._broken = mode

    def requests(self, method: str | None = None) -> list[Recorded]:
        with self._lock:
            return [r for r in self._requests if method is None or r.method == method]

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()  # joins the handler threads
        self._thread.join(5.0)

    def __enter__(self) -> FakeIMDS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- handler threads -----------------------------------------------------------------
    def _handle(self, handler: _Handler, body: bytes) -> None:
        headers = {k.lower(): v for k, v in handler.headers.items()}
        with self._lock:
            self._requests.append(Recorded(handler.command, handler.path, headers, body))
            broken = self._broken
            document = {"DocumentIncarnation": self._incarnation, "Events": self._events}
        try:
            if broken == "hang":
                self._release.wait(self.hang_seconds)
                return  # close without an answer
            if headers.get("metadata") != "true":
                self._reply(handler, 400, {"error": "Bad request. Required metadata header "
                                                    "not specified"})
            elif broken == "500":
                self._reply(handler, 500, {"error": "Internal Server Error"})
            elif broken == "garbage":
                self._reply(handler, 200, b"<html>not json{")
            elif handler.path.startswith(COMPUTE_NAME_PATH):
                self._reply(handler, 200, self.compute_name.encode(), "text/plain")
            elif not handler.path.startswith(SCHEDULED_EVENTS_PATH):
                self._reply(handler, 404, {"error": "Not found"})
            elif handler.command == "POST":
                try:
                    json.loads(body)
                except ValueError:
                    self._reply(handler, 400, {"error": "Bad request. Invalid JSON"})
                else:
                    self._reply(handler, 200, b"")
            else:
                self._reply(handler, 200, document)
        except OSError:
            pass  # the client gave up (its timeout) before the answer: nothing to do

    @staticmethod
    def _reply(handler: _Handler, status: int, payload: Any,
               content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
