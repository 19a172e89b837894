"""Which inherited environment variables are the worker's secrets, kept from its tasks.

A name is matched the way secret scanners match it: split into words (on ``_``, ``-``, ``.``,
a lower-to-upper case change and a letter/digit change), then a word list over the words --
not a substring search, so ``PATH`` is not ``PAT`` and ``KEYBOARD`` not ``KEY``.

A name is a secret when
* one of its words is in ``SECRET_WORDS`` (``KEY``, ``DB_PASS``, ``GITHUB_PAT``,
  ``AZURE_STORAGE_SAS``, ``apiKey``), or
* one of its words ends with one of ``SECRET_SUFFIXES`` (``DBPASSWORD``, ``MYTOKEN``), or
* two words next to each other are a phrase of ``SECRET_PHRASES``
  (``AZURE_STORAGE_CONNECTION_STRING``),
or it is one of ``SECRET_NAMES`` (``JOBQ_POSTGRES_URL``, ``PGPASSFILE``, a managed identity's
``IDENTITY_HEADER``),
and it is not in ``NOT_SECRET`` (``PWD``: the shell's working directory).  A variable is kept
from a task when its name is a secret's or its value holds one (core/secret_values.py:
``DATABASE_URL=postgres://app:PASSWORD@...``), unless the operator lets it through by name
(``--pass-env NAME,NAME``).

Called by worker/process.py (the main thread, once per inherited variable at start:
worker/launch.py keeps the result) and the dashboard's masking; docs/security.rst lists the
words.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from .secret_values import is_secret_value

SECRET_WORDS = frozenset({
    "key", "keys", "apikey", "accesskey", "secretkey", "privatekey", "signingkey",
    "token", "tokens", "secret", "secrets",
    "pass", "passwd", "password", "passwords", "passphrase", "pwd", "pat",
    "sas", "credential", "credentials", "cred", "creds", "auth", "private", "signature",
    "connstr", "connectionstring",
    # a Sentry DSN holds its project's key; an HTTP Authorization header's value
    "dsn", "authorization",
})
# A word that ends with one of these is a secret too; only words no common word ends with
# (there is no such suffix rule for "key": monkey, turkey).
SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret", "secrets", "token", "tokens",
                   "apikey", "credential", "credentials")
SECRET_PHRASES = frozenset({("connection", "string"), ("conn", "str"), ("conn", "string")})
# Whole names that are secrets though no word says so: the PostgreSQL backend's URL (it may
# hold the password), libpq's password file, and what a managed identity's token endpoint
# wants as proof (App Service / Functions / Container Apps: IDENTITY_HEADER; the older
# MSI_SECRET is caught by its word).  Their endpoints (IDENTITY_ENDPOINT, MSI_ENDPOINT) are
# no secret: a loopback URL, useless without the header.
SECRET_NAMES = frozenset({"JOBQ_POSTGRES_URL", "PGPASSFILE", "PGPASSWORD", "IDENTITY_HEADER"})
# Whole names that match a word but are no secret.
NOT_SECRET = frozenset({"PWD"})

# An upper-case run followed by an upper+lower word (the "API" of "APIKey"), a capitalised
# or lower-case word, or a run of digits.
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def name_words(name: str) -> list[str]:
    """The lower-case words of a variable name (``"myAPIKey_2"``: my, api, key, 2)."""
    return [w.lower() for w in _WORD.findall(name)]


def is_secret_name(name: str) -> bool:
    """Does the name of an environment variable say it holds a secret?"""
    if name in SECRET_NAMES:
        return True
    if name in NOT_SECRET:
        return False
    words = name_words(name)
    if any(w in SECRET_WORDS or w.endswith(SECRET_SUFFIXES) for w in words):
        return True
    return any(pair in SECRET_PHRASES for pair in zip(words, words[1:]))


def is_secret(name: str, value: str) -> bool:
    """Is the variable a secret, by its name or by its value?"""
    return is_secret_name(name) or is_secret_value(value)


def without_secrets(env: Mapping[str, str], pass_env: Collection[str] = ()) -> dict[str, str]:
    """``env`` minus the secrets (by name or value), except the names in ``pass_env``."""
    return {k: v for k, v in env.items() if k in pass_env or not is_secret(k, v)}
