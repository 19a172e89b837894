"""Which values hold a secret whatever their variable or option is called, and those values
with the secret cut out.

A value is a secret when it holds
* a URL's credentials: ``scheme://user:password@`` (``DATABASE_URL``, ``HTTPS_PROXY``,
  ``redis://:password@``), or a user part alone that looks like a token (20 or more letters,
  digits, ``_`` or ``-``: a Sentry DSN's key, ``https://ghp_...@github.com``) -- not
  ``ssh://git@host``;
* an Azure connection string's key: ``AccountKey=``, ``SharedAccessKey=``,
  ``SharedAccessSignature=``;
* a SAS token's signature: ``sig=`` at the start or after ``?``, ``&`` or ``;``;
* libpq's ``password=`` keyword (``host=db password=...``).

``redact`` replaces the secret part with ``***`` and keeps the rest (the host, the account
name), so that what is left still says what the value was for.

Called by core/secret_names.py (``without_secrets``: the worker's main thread, once per
inherited variable at start), the dashboard's page handlers (waitress threads, per value
shown) and core/argv_secrets.py (main thread, at start-up).  A substring test first (what
every secret holds: "@" or one of the keywords), then one regular expression, compiled the
first time a value passes the test: compiling it costs ~1 ms, which a ``jobq-ctl`` whose
arguments hold no such thing never pays.
"""

from __future__ import annotations

import functools
import re

MASK = "***"
# Every secret below holds one of these (lower case).
_HINTS = ("@", "accountkey", "sharedaccess", "sig=", "password")

# Each alternative's group 1 is what comes before the secret, kept by ``redact``; the secret
# runs up to the end of the match.
_SECRET = (
    # URL credentials: a password (what follows the first ":" of the user part, up to "@");
    # "/", "?", "#" cannot be in a user part, so a port and a path are never taken for one
    r"([a-z][a-z0-9+.-]*://[^/?#@\s:]*:)[^/?#@\s]+(?=@)"
    # ... or a user part alone that is token-like
    r"|([a-z][a-z0-9+.-]*://)[A-Za-z0-9_-]{20,}(?=@)"
    # Azure connection strings and SAS tokens; libpq's key=value form
    r"|((?:^|[;\s])(?:AccountKey|SharedAccessKey|SharedAccessSignature)\s*=\s*)[^;\s]*"
    r"|((?:^|[?&;])sig=)[^&;\s#]*"
    r"|((?:^|\s)password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|\S*)")


@functools.cache
def _pattern() -> re.Pattern[str]:
    # ASCII: the keywords are; case folding over all of Unicode tripled the compile time
    return re.compile(_SECRET, re.IGNORECASE | re.ASCII)


def _hinted(value: str) -> bool:
    lower = value.lower()
    return any(hint in lower for hint in _HINTS)


def is_secret_value(value: str) -> bool:
    """Does ``value`` hold a credential (any thread)?"""
    return _hinted(value) and _pattern().search(value) is not None


def redact(value: str, same_length: bool = False) -> str:
    """``value`` with every credential in it replaced by ``***``, or by as many ``*`` as it
    had characters with ``same_length`` (any thread)."""

    def masked(match: re.Match[str]) -> str:
        prefix = next(group for group in match.groups() if group is not None)
        return prefix + ("*" * (match.end() - match.start() - len(prefix)) if same_length
                         else MASK)

    return _pattern().sub(masked, value) if _hinted(value) else value
