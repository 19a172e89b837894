"""The dashboard's auth model (request threads): read-only unless a token is configured; with
one, an operator logs in with it (compared with ``hmac.compare_digest``) and gets a signed
session cookie; every POST carries the session's CSRF token."""

from __future__ import annotations

import hmac
import re
import secrets
from typing import Any

from flask import abort, request, session

NAME = re.compile(r"[A-Za-z0-9._-]{1,40}")


def read_token(path: str) -> str:
    """The token in ``path`` (first line, stripped); OSError or ValueError when unusable."""
    with open(path, encoding="utf-8") as fh:
        token = fh.readline().strip()
    if len(token) < 16:
        raise ValueError(f"--token-file: {path}: the token must be at least 16 characters")
    return token


class Auth:
    def __init__(self, token: str | None) -> None:
        self.token = token

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def login(self, given: str, name: str) -> bool:
        """Check ``given`` against the token; on success the session carries the login."""
        if self.token is None:
            return False
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return False
        session.clear()
        session["who"] = f"{name}@dashboard"
        session["csrf"] = secrets.token_urlsafe(32)  # a new one: no fixation across login
        return True

    @staticmethod
    def who() -> str | None:
        value = session.get("who")
        return value if isinstance(value, str) else None

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
            abort(403, "log in first")

    def context(self) -> dict[str, Any]:
        return {"can_act": self.enabled and self.who() is not None,
                "auth_enabled": self.enabled, "who": self.who(), "csrf": self.csrf()}
