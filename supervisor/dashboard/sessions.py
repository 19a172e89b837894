"""The dashboard's login sessions, kept server-side (request threads).

Flask's own session is a signed cookie: the server keeps nothing, so it cannot end one -- a
cookie copied before a logout would still be accepted until the app's secret changes.  So the
cookie carries only a random session id (and the CSRF token); who logged in, with which token
(its SHA-256) and when the session was last used live here, in the dashboard process.  A
session ends at logout, after ``idle_timeout`` seconds without a request the operator made
(the page's own background refreshes do not count: an open tab left alone ends too), ``max_age``
seconds after its login however busy it is (a cookie stolen from a tab in use is good for that
long at most), when the token file's token is no longer the one it was made with, and when the
dashboard stops.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Callable

DEFAULT_IDLE_TIMEOUT = 30 * 60.0  # --session-idle-timeout's default
DEFAULT_MAX_AGE = 12 * 3600.0  # --session-max-age's default: a working day


class _Session:
    __slots__ = ("who", "token_id", "seen", "started")

    def __init__(self, who: str, token_id: str, seen: float) -> None:
        self.who, self.token_id, self.seen = who, token_id, seen
        self.started = seen


class Sessions:
    """Live sessions by id.  ``clock``: monotonic seconds (tests inject one)."""

    def __init__(self, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic,
                 max_age: float = DEFAULT_MAX_AGE) -> None:
        self.idle_timeout = idle_timeout
        self.max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._live: dict[str, _Session] = {}

    def start(self, who: str, token_id: str) -> str:
        """A new session's id (a login).  Sessions idle past the timeout or older than the
        maximum age are forgotten here: only someone who has the token can add one, so this
        is all the pruning needed."""
        sid = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            for old in [k for k, s in self._live.items() if self._ended(s, now)]:
                del self._live[old]
            self._live[sid] = _Session(who, token_id, now)
        return sid

    def who(self, sid: str, token_id: str | None, active: bool) -> tuple[str | None, str]:
        """(the login, "") of a live session made with ``token_id``, else (None, why it
        ended; "" for an id never seen or already ended).  ``active``: a request the operator
        made, which restarts the idle time.  ``token_id`` None: the token file cannot be read
        now, so no session is good, but none ends (it may be a rewrite caught halfway)."""
        now = self._clock()
        with self._lock:
            found = self._live.get(sid)
            if found is None or token_id is None:
                return None, ""
            if found.token_id != token_id:
                del self._live[sid]
                return None, "the token changed"
            why = self._ended(found, now)
            if why:
                del self._live[sid]
                return None, why
            if active:
                found.seen = now
            return found.who, ""

    def _ended(self, found: _Session, now: float) -> str:
        """Why ``found`` has timed out at ``now``, or "" (lock held)."""
        if now - found.started > self.max_age:
            return f"older than the maximum age ({self.max_age:g} s)"
        if now - found.seen > self.idle_timeout:
            return f"idle for more than {self.idle_timeout:g} s"
        return ""

    def end(self, sid: str) -> str | None:
        """End one session (logout); its login, if it was live."""
        with self._lock:
            found = self._live.pop(sid, None)
        return found.who if found is not None else None

    def keep_only(self, token_id: str) -> int:
        """End every session made with another token (the token file changed); how many."""
        with self._lock:
            stale = [k for k, s in self._live.items() if s.token_id != token_id]
            for sid in stale:
                del self._live[sid]
        return len(stale)
