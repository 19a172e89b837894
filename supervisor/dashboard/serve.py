"""``jobq-ctl dashboard``: checks the options, builds the app and serves it with waitress
(main thread; waitress's request threads and the depth sampler run beside it).  One-line
errors, exit 2, for a missing extra, a bad --bind, a non-loopback bind without a token, an
unusable token file, a --session-idle-timeout or --session-max-age of 0 or a malformed
--allowed-hosts name."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import queue
import re
import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..core.options import UsageError
from ..core.settings import BILLED_PER_CALL, Settings

if TYPE_CHECKING:
    from .data import DataSource
from ..core.threads import start_thread

EXTRA = "pip install 'jobq-supervisor[dashboard]'"
DEFAULT_BIND = "127.0.0.1:8080"
SAMPLE_INTERVAL = 15.0  # s between the sampler's reads (Azure: a few calls per minute)
THREADS = 8
# A DNS name or an address literal, as a Host header carries it without its port.
HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9.])?|\[?[0-9a-f:.]+\]?")


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); UsageError when malformed."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--bind: expected HOST:PORT, got {text!r}")
    return host, int(port)


def allowed_hosts(text: str) -> list[str]:
    """``--allowed-hosts a.example,b.example`` -> the names; UsageError for one that is not
    a host name (a scheme, a path, a port or a wildcard)."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    for name in names:
        if not HOST_NAME.fullmatch(name):
            raise UsageError(f"--allowed-hosts: {name!r} is not a host name (no scheme, "
                             f"port or path; e.g. jobq.example.com)")
    return names


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to anything


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _source(settings: Settings, key: Any, writes: bool) -> DataSource:
    """One queue's DataSource (main thread); its clients open lazily, per thread; ``key``:
    ops.keys.first_key's."""
    from ..backends import open_backend
    from ..fleet.control.open import open_control_store
    from ..fleet.output.open import open_output_store
    from .data import DataSource

    return DataSource(settings.queue,
                      lambda: open_backend(settings, for_ctl=True, create=False),
                      lambda: open_control_store(settings, create=writes), key,
                      lambda: open_output_store(settings, create=False))


def run(ns: argparse.Namespace, settings: Settings) -> int:
    """Serve until SIGTERM or SIGINT; the exit status (main thread)."""
    try:
        import flask  # noqa: F401
        import waitress
    except ImportError:
        print(f"jobq-ctl: error: dashboard: Flask and waitress are not installed: {EXTRA}",
              file=sys.stderr)
        return 2
    from ..ops.keys import first_key
    from .app import create_app
    from .auth import read_token
    from .edges import HostCheck
    from .history import History, Sampler
    from .sessions import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_AGE

    try:
        host, port = parse_bind(ns.bind)
        if not ns.token_file and not is_loopback(host):
            raise UsageError(f"--bind {ns.bind}: a non-loopback address needs --token-file "
                             f"(or bind 127.0.0.1 and use an SSH tunnel or a reverse proxy)")
        token = read_token(ns.token_file) if ns.token_file else None
        idle = getattr(ns, "session_idle_timeout", None)
        idle = DEFAULT_IDLE_TIMEOUT if idle is None else idle
        if idle <= 0:
            raise UsageError("--session-idle-timeout: must be more than 0")
        max_age = getattr(ns, "session_max_age", None)
        max_age = DEFAULT_MAX_AGE if max_age is None else max_age
        if max_age <= 0:
            raise UsageError("--session-max-age: must be more than 0")
        hosts = HostCheck(host, allowed_hosts(getattr(ns, "allowed_hosts", "") or ""))
        key = first_key(ns)
    except (OSError, ValueError, UsageError) as exc:
        text = f"--token-file: {exc}" if isinstance(exc, OSError) else str(exc)
        print(f"jobq-ctl: error: dashboard: {text}", file=sys.stderr)
        return 2
    logging.getLogger("jobq.dashboard").setLevel(logging.INFO)
    sources = [_source(replace(settings, queue=name), key, token is not None)
               for name in settings.queues]  # --queue high,low: one DataSource per queue
    histories = {d.queue: History() for d in sources}
    sampler = Sampler([(d, histories[d.queue]) for d in sources],
                      interval=getattr(ns, "sample_interval", SAMPLE_INTERVAL))
    # Azure bills (and throttles) per call: an open page refreshes less often there
    app = create_app(sources, histories, token,
                     refresh=15 if settings.backend in BILLED_PER_CALL else 5,
                     token_file=ns.token_file, idle_timeout=idle, max_age=max_age,
                     hosts=hosts, secure_cookies=bool(getattr(ns, "secure_cookies", False)))
    try:
        server = waitress.create_server(app, host=host, port=port, threads=THREADS,
                                        ident="jobq-dashboard")
    except OSError as exc:
        print(f"jobq-ctl: error: dashboard: cannot listen on {ns.bind}: {exc.strerror}",
              file=sys.stderr)
        return 2
    signals: queue.SimpleQueue[int] = queue.SimpleQueue()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda num, _frame: signals.put(num))
    bound = _url(host, server.effective_port)
    print(f"dashboard on {bound} ({'actions need a login' if token else 'read-only'})",
          file=sys.stderr, flush=True)
    sampler.start()
    thread = start_thread(server.run, "dashboard-server")
    try:
        while thread.is_alive():
            try:
                signals.get(timeout=1.0)
                break
            except queue.Empty:
                continue
    finally:
        sampler.close()
        server.close()
    return 0
