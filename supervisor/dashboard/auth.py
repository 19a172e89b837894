"""The dashboard's auth model (request threads): read-only unless a token is configured; with
one, an operator logs in with it (compared with ``hmac.compare_digest``) and gets a session
(sessions.py: kept server-side, the signed cookie carries its id); every POST carries the
session's CSRF token.  With ``--token-file`` the file is read again on every request that logs
in or carries a session, so a new token ends the sessions made with the old one at once."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
from typing import Any

from flask import abort, g, request, session

from .sessions import Sessions

NAME = re.compile(r"[A-Za-z0-9._-]{1,40}")
# Sent by the page's own script with its background refreshes (static/app.js): a request the
# operator did not make, which does not keep a session from going idle.
REFRESH_HEADER = "X-Jobq-Refresh"
log = logging.getLogger("jobq.dashboard")


def read_token(path: str) -> str:
    """The token in ``path`` (first line, stripped); OSError or ValueError when unusable."""
    with open(path, encoding="utf-8") as fh:
        token = fh.readline().strip()
    if len(token) < 16:
        raise ValueError(f"--token-file: {path}: the token must be at least 16 characters")
    return token


def token_id(token: str) -> str:
    """What a session keeps of the token it was made with: its SHA-256, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()


class Auth:
    """``token``: the operators' token (None: read-only); ``token_file``: where it came from,
    read again per request (then ``token`` is its content at start)."""

    def __init__(self, token: str | None, sessions: Sessions | None = None,
                 token_file: str | None = None) -> None:
        self.token = token
        self.token_file = token_file
        self.sessions = sessions if sessions is not None else Sessions()
        self._lock = threading.Lock()
        self._seen_id = token_id(token) if token is not None else None
        self._problem = ""  # why the token file cannot be used now, logged once

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def _current(self) -> str | None:
        """The token now: the file's, read again (once per request); None while the file
        cannot be read or holds no usable token (then no login and no session is good)."""
        if "jobq_token" in g:
            return g.jobq_token
        token = self.token
        if self.token_file is not None:
            try:
                token = read_token(self.token_file)
                problem = ""
            except (OSError, ValueError) as exc:
                token, problem = None, str(exc)
            self._note(token, problem)
        g.jobq_token = token
        return token

    def _note(self, token: str | None, problem: str) -> None:
        """Log a change of the token file once, and end the sessions of an old token."""
        with self._lock:
            new_id = token_id(token) if token is not None else None
            changed = new_id is not None and new_id != self._seen_id
            if changed:
                self._seen_id = new_id
            logged, self._problem = self._problem, problem
        if problem and problem != logged:
            log.warning("dashboard: --token-file %s unusable, no login works until it is "
                        "fixed: %s", self.token_file, problem)
        if changed and new_id is not None:
            ended = self.sessions.keep_only(new_id)
            log.warning("dashboard: the token in %s changed: %d session(s) ended",
                        self.token_file, ended)

    def usable(self) -> bool:
        """Whether there is a token to log in with now (the token file can be read)."""
        return self._current() is not None

    def login(self, given: str, name: str) -> bool:
        """Check ``given`` against the token; on success a new session carries the login."""
        token = self._current()
        if token is None:
            return False
        if not hmac.compare_digest(given.encode(), token.encode()):
            return False
        self.logout()
        who = f"{name}@dashboard"
        session["sid"] = self.sessions.start(who, token_id(token))
        session["csrf"] = secrets.token_urlsafe(32)  # a new one: no fixation across login
        g.jobq_who = who
        return True

    def logout(self) -> str | None:
        """End this request's session, server-side too; the login it had, if any."""
        sid = session.get("sid")
        who = self.sessions.end(sid) if isinstance(sid, str) else None
        session.clear()
        g.jobq_who = None
        return who

    def who(self) -> str | None:
        """The login of this request's session (resolved once per request); a session that
        has ended is dropped from the cookie."""
        if "jobq_who" in g:
            return g.jobq_who
        who: str | None = None
        sid = session.get("sid")
        if isinstance(sid, str) and self.enabled:
            token = self._current()
            who, why = self.sessions.who(sid, None if token is None else token_id(token),
                                         active=request.headers.get(REFRESH_HEADER) != "1")
            if who is None and token is not None:
                session.pop("sid", None)
                g.jobq_ended = True
                if why:
                    log.info("dashboard: a session ended: %s", why)
        g.jobq_who = who
        return who

    @staticmethod
    def csrf() -> str:
        """This session's CSRF token (made on first use)."""
        token = session.get("csrf")
        if not isinstance(token, str):
            token = secrets.token_urlsafe(32)
            session["csrf"] = token
        return token

    def check_post(self, need_login: bool = True) -> None:
        """Abort a POST: 403 without a token configured, without a login (unless
        ``need_login`` is False) or without the right CSRF token."""
        if not self.enabled:
            abort(403, "the dashboard is read-only (started without --token-file)")
        given = request.form.get("csrf", "")
        expected = session.get("csrf")
        if not isinstance(expected, str) or not hmac.compare_digest(given.encode(),
                                                                    expected.encode()):
            abort(403, "missing or wrong CSRF token: reload the page and try again")
        if need_login and self.who() is None:
            if g.get("jobq_ended"):
                abort(403, "your session has ended (logout, idle timeout or a new token): "
                           "log in again")
            abort(403, "log in first")

    def context(self) -> dict[str, Any]:
        return {"can_act": self.enabled and self.who() is not None,
                "auth_enabled": self.enabled, "who": self.who(), "csrf": self.csrf()}
