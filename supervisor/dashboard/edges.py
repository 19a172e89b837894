"""The dashboard's edges: which Host headers it answers, where an action may send the browser
back to, and how many failed logins it takes (request threads; built on the main thread).

* Host: a page of another site whose name an attacker points at 127.0.0.1 (DNS rebinding) is,
  to the browser, of the attacker's origin, so its script may read every answer -- unless the
  dashboard refuses a Host it does not serve as.  It answers the address it is bound to, the
  loopback names when bound to loopback, any address literal when bound to every address
  (0.0.0.0, ::; no page can rebind to a literal: its origin would be the dashboard's own),
  and the names of ``--allowed-hosts``; anything else is a 400 before any route runs.
* ``back=``: browsers drop tab, CR and LF anywhere in a URL and read ``\\`` as ``/``, so
  ``/\\t/evil.example`` becomes ``//evil.example``, another site.  Only a path on this site
  is followed: printable, starting with one ``/``, no backslash, and no scheme or host
  however it is split.
* Pages: a string from a message (an id, a command) keeps no control or bidi character
  (``page_text``): autoescaping leaves U+202E alone, and it reorders what follows it.
* Logins: ``LoginThrottle``, a sliding window of failed logins per client address and over
  all of them.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, abort, request
from markupsafe import Markup

from ..core.shown import shown

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
WINDOW = 60.0  # s: the failed logins counted are those of the last minute
PER_CLIENT = 10  # failed logins per WINDOW from one client address
OVERALL = 30  # failed logins per WINDOW from all addresses together


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def host_name(host: str) -> str:
    """The name part of a Host header (``name:port``, ``[v6]:port``), lower case, without a
    trailing dot ("localhost." is localhost)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


class HostCheck:
    """Which Host names the dashboard answers; ``bind``: the address it listens on,
    ``allowed``: ``--allowed-hosts``'s names (a reverse proxy's public name)."""

    def __init__(self, bind: str, allowed: Collection[str] = ()) -> None:
        bind = bind.strip("[]").lower()
        self.any_address = bind in WILDCARDS
        self.names = {host_name(n) for n in allowed if n.strip()}
        self.names.add(bind)
        address = _address(bind)
        if bind == "localhost" or (address is not None and address.is_loopback):
            self.names |= LOOPBACK_NAMES

    def allows(self, host: str) -> bool:
        name = host_name(host)
        if name in self.names:
            return True
        address = _address(name)
        if address is None:
            return False
        # "::ffff:127.0.0.1" and "127.0.0.1" are one address; so are "::1" and "0::1"
        return self.any_address or str(address) in self.names

    def install(self, app: Flask) -> None:
        """Refuse a request with any other Host before its route runs (and before a 404)."""

        @app.before_request
        def _check_host() -> None:
            host = request.headers.get("Host", "")
            if not self.allows(host):
                abort(400, f"this dashboard does not answer to the host name "
                           f"{host_name(host)[:80]!r} (a DNS-rebinding page?): open it by "
                           f"its address, or add the name with --allowed-hosts")


def page_text(value: Any) -> Any:
    """Jinja's ``finalize``: every ``{{ }}`` string through ``shown`` (newlines and tabs
    kept: a ``<pre>`` shows them), the app's own Markup (charts) as it is."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return shown(value, lines=True)
    return value


def local_path(target: str) -> bool:
    """Whether ``target`` (an action's ``back=``) is a path on this site, as a browser would
    read it: no control or format character (browsers drop some of them, which can turn
    ``/\\t/x`` into ``//x``), no backslash (read as ``/``), one leading ``/``, and no scheme
    or host however it is split."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return False
    if not target.isprintable() or target != target.strip():
        return False
    parts = urlsplit(target)
    return not parts.scheme and not parts.netloc


class LoginThrottle:
    """Failed logins in the last ``window`` seconds, per client address and in all; a login
    is refused, its token not even compared, once either count is at its bound.  Counted
    before the comparison (``attempt``) and taken back when the login succeeds
    (``succeeded``), so concurrent requests cannot all slip in under the bound.  Memory stays
    bounded: at most ``overall`` times are kept.  ``clock``: monotonic seconds (tests inject
    one)."""

    def __init__(self, per_client: int = PER_CLIENT, overall: int = OVERALL,
                 window: float = WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_client, self.overall, self.window = per_client, overall, window
        self._clock = clock
        self._lock = threading.Lock()
        self._all: deque[float] = deque()
        self._by_client: dict[str, deque[float]] = {}
        self._refusing: set[str] = set()  # clients refused since their last counted attempt

    def _forget(self, now: float) -> None:
        """Drop what left the window (lock held)."""
        while self._all and now - self._all[0] >= self.window:
            self._all.popleft()
        for client in list(self._by_client):
            times = self._by_client[client]
            while times and now - times[0] >= self.window:
                times.popleft()
            if not times:
                del self._by_client[client]

    def attempt(self, client: str) -> tuple[float, bool]:
        """Count a login attempt from ``client``: (0.0, False) if it may be tried, else (the
        seconds until one may, whether it is the client's first refusal since its last
        counted attempt: the one worth a log line) -- then nothing is counted."""
        now = self._clock()
        with self._lock:
            self._forget(now)
            times = self._by_client.get(client, deque())
            full = [q for q, bound in ((times, self.per_client), (self._all, self.overall))
                    if len(q) >= bound]
            if full:
                first = client not in self._refusing
                if first and len(self._refusing) < self.overall:  # bounded memory
                    self._refusing.add(client)
                return max(self.window - (now - q[0]) for q in full), first
            self._refusing.discard(client)
            times.append(now)
            self._by_client[client] = times
            self._all.append(now)
        return 0.0, False

    def succeeded(self, client: str) -> None:
        """The attempt just counted for ``client`` logged in: it is not a failure."""
        with self._lock:
            times = self._by_client.get(client)
            if times:
                at = times.pop()
                if not times:
                    del self._by_client[client]
                try:
                    self._all.remove(at)
                except ValueError:
                    pass  # already left the window
