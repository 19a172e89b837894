"""``--metrics-port``: the worker's metrics (worker/metrics.py, the registry of the metrics
file) served over HTTP at ``/metrics`` for Prometheus to scrape.

prometheus-client's own exposition app (``make_wsgi_app``: content negotiation, gzip,
``name[]`` filters) on the standard library's WSGI server, as prometheus-client's
``start_http_server`` serves it -- but on a thread of ours (core/threads.py): the library's
helper starts a thread of its own that would take the worker's signals and that nothing
stops.  One request at a time (Prometheus scrapes a target sequentially) with a socket
timeout, so a stuck client never holds more than the serve thread, and never the data plane:
a scrape only reads the registry's values (each behind prometheus-client's lock).

The socket is bound on the main thread at start, before any task runs: a port in use is one
line and exit status 2 (``MetricsUnavailable``), not a worker that runs without its metrics.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import sys
import threading
from typing import TYPE_CHECKING, Union

from ..core.threads import start_thread
from .metrics import MetricsUnavailable

if TYPE_CHECKING:  # names only: http.server and wsgiref load only with --metrics-port
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    from ..core.settings import Settings
    from .metrics import Metrics

log = logging.getLogger("jobq.metrics")

REQUEST_TIMEOUT = 10.0  # s a client may take to send its request or read the answer
STOP_WAIT = 5.0  # s the serve thread gets to end (it finishes the request in hand first)


def _quiet_handler() -> type[WSGIRequestHandler]:
    """The request handler: a socket timeout, and no access-log line per scrape on stderr
    (the worker's log is the journal)."""
    from wsgiref.simple_server import WSGIRequestHandler

    class Quiet(WSGIRequestHandler):
        timeout = REQUEST_TIMEOUT

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's)
            pass

    return Quiet


class MetricsServer:
    """The serve thread.  Built (the socket bound), started and stopped by the main thread;
    requests are answered on the serve thread."""

    def __init__(self, metrics: Metrics, address: str, port: int) -> None:
        from wsgiref.simple_server import WSGIServer, make_server

        from prometheus_client import make_wsgi_app  # installed: Metrics checked it

        try:
            family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                        flags=socket.AI_PASSIVE)[0][0]
            server_class = type("Server", (WSGIServer,), {"address_family": family,
                                                          "handle_error": _request_failed})
            self.httpd: WSGIServer = make_server(address, port, make_wsgi_app(metrics.registry),
                                                 server_class, handler_class=_quiet_handler())
        except OSError as exc:  # socket.gaierror too
            raise MetricsUnavailable(f"--metrics-port: cannot listen on "
                                     f"{_join(address, port)}: {exc.strerror or exc}") from None
        self.address = address
        self.port: int = self.httpd.server_address[1]  # the chosen one, for port 0
        self._thread: Union[threading.Thread, None] = None
        self._stop = threading.Event()
        # serve_forever would look at its stop flag only every poll interval (0.5 s more per
        # worker exit): a byte on this pipe ends the wait at once
        self._wake_r, self._wake_w = os.pipe()

    @classmethod
    def for_worker(cls, settings: Settings, metrics: Metrics) -> Union[MetricsServer, None]:
        """The worker's server, or None without ``--metrics-port`` (main thread)."""
        if settings.metrics_port is None:
            return None
        return cls(metrics, settings.metrics_address, settings.metrics_port)

    @property
    def url(self) -> str:
        return f"http://{_join(self.address, self.port)}/metrics"

    def start(self) -> None:
        """Serve on a thread of its own (main thread)."""
        self._thread = start_thread(self._serve, "metrics-http")
        log.info("metrics served at %s", self.url)

    def stop(self) -> None:
        """Stop serving and close the socket (main thread)."""
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(STOP_WAIT)
        self.httpd.server_close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _serve(self) -> None:
        """Answer each connection in turn until ``stop`` (the serve thread)."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.httpd, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self.httpd and not self._stop.is_set():
                        self.httpd.handle_request()  # readable: no wait for the accept


def _request_failed(server: object, request: object, client_address: object) -> None:
    """A scrape that failed (a client gone or too slow): one DEBUG line, not the traceback
    socketserver prints on stderr (the serve thread)."""
    log.debug("metrics scrape from %s failed: %s", client_address, sys.exc_info()[1])


def _join(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
